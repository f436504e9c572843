// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"testing"
	"unsafe"
)

// TestSessionSize guards the Session's size (the target: at most 512 B per
// in-flight session): a field added or reordered carelessly would move it
// up a size class.
func TestSessionSize(t *testing.T) {
	if got := unsafe.Sizeof(Session{}); got > 248 {
		t.Errorf("Session is %d B, want at most 248 (see the comment on Session)", got)
	}
}

// The Table allocates a Session with its Observer's state (a pointer, for
// the processor) as one entry: 256 B, a Go size class, so it wastes nothing.
func TestEntrySize(t *testing.T) {
	if got := unsafe.Sizeof(entry[*struct{}]{}); got > 256 {
		t.Errorf("entry is %d B, want at most 256 (see the comment on Session)", got)
	}
}
