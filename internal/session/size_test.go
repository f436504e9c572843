package session

import (
	"testing"
	"unsafe"
)

// TestSessionSize guards the Session's size class (issue 7: at most 512 B
// per in-flight session): a field added or reordered carelessly would move
// it up to the next class. 240 is a Go size class, so an allocated Session
// wastes nothing.
func TestSessionSize(t *testing.T) {
	if got := unsafe.Sizeof(Session{}); got > 240 {
		t.Errorf("Session is %d B, want at most 240 (see the comment on Session)", got)
	}
}

// The Table allocates a Session with its Observer's state (a pointer, for
// the processor) as one entry: 232 B, still in the 240 B size class.
func TestEntrySize(t *testing.T) {
	if got := unsafe.Sizeof(entry[*struct{}]{}); got > 240 {
		t.Errorf("entry is %d B, want at most 240 (see the comment on Session)", got)
	}
}
