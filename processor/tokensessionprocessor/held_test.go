// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// A kept session waits only for what it has to wait for: nothing (no
// engine scraped, no engine span awaited) holds nothing; a timing wait
// holds it until the wait ends; shutdown (force) writes every one; past
// maxHeld, a session's outputs are not held and full says so.
func TestHeldOutputs(t *testing.T) {
	hs := heldOutputs{engines: &engineContext{}}
	var written []string
	write := func(s *session.Session, _ *session.End) { written = append(written, s.ID) }

	h, full := hs.hold(&session.Session{ID: "none"}, &session.End{}, 0, false, 100)
	assert.Nil(t, h, "nothing to wait for")
	assert.False(t, full)

	for i, id := range []string{"a", "b"} {
		h, full = hs.hold(&session.Session{ID: id}, &session.End{}, int64(200+100*i), false, 100)
		require.NotNil(t, h, id)
		assert.False(t, full)
	}
	assert.Equal(t, 2, hs.len())
	hs.release(199, false, write)
	assert.Empty(t, written, "both still wait")
	hs.release(200, false, write)
	assert.Equal(t, []string{"a"}, written, "a's wait is over")
	hs.release(201, true, write)
	assert.Equal(t, []string{"a", "b"}, written, "shutdown writes what waits")
	assert.Zero(t, hs.len())

	for range maxHeld {
		_, full = hs.hold(&session.Session{}, &session.End{}, 1000, false, 100)
		require.False(t, full)
	}
	h, full = hs.hold(&session.Session{ID: "over"}, &session.End{}, 1000, false, 100)
	assert.Nil(t, h)
	assert.True(t, full, "maxHeld outputs wait already")
}
