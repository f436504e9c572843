// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"testing"
	"unsafe"
)

// TestSessionSize guards the Session's size (the target: at most 512 B per
// in-flight session): a field added or reordered carelessly would move its
// entry up a size class.
func TestSessionSize(t *testing.T) {
	if got := unsafe.Sizeof(Session{}); got > 240 {
		t.Errorf("Session is %d B, want at most 240 (see the comment on Session)", got)
	}
}
