// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"testing"
	"unsafe"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// TestSessionEntrySize guards what the session table allocates per session:
// the Session and this processor's state beside it, one object of 288 B, a
// Go size class (the next is 320). A field added to either would cost a
// session 32 B more.
func TestSessionEntrySize(t *testing.T) {
	if got := unsafe.Sizeof(session.Session{}) + unsafe.Sizeof(sessionState{}); got > 288 {
		t.Errorf("Session and sessionState are %d B, want at most 288", got)
	}
}
