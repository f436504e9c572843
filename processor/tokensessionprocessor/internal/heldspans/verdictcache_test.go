// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package heldspans

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
)

// lruOrder lists the cached trace IDs (by tid number) from most to least
// recently used, checking the links both ways.
func lruOrder(t *testing.T, c *verdictCache) []byte {
	t.Helper()
	var out []byte
	prev := none
	for i := c.head; i != none; i = c.entries[i].next {
		require.Equal(t, prev, c.entries[i].prev, "back link of entry %d", i)
		require.Equal(t, i, c.index[c.entries[i].id], "index of entry %d", i)
		out = append(out, c.entries[i].id[15])
		prev = i
	}
	require.Equal(t, prev, c.tail)
	require.Len(t, c.index, len(out))
	return out
}

func TestVerdictCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := newVerdictCache(3)
	c.put(tid(1), true, th0)
	c.put(tid(2), false, th0)
	c.put(tid(3), true, th0)
	assert.Equal(t, []byte{3, 2, 1}, lruOrder(t, c))

	keep, _, known := c.get(tid(1)) // refreshes 1: 2 is now the oldest
	assert.True(t, keep)
	assert.True(t, known)
	assert.Equal(t, []byte{1, 3, 2}, lruOrder(t, c))

	c.put(tid(4), false, th0)
	assert.Equal(t, []byte{4, 1, 3}, lruOrder(t, c))
	_, _, known = c.get(tid(2))
	assert.False(t, known, "2 was least recently used")

	c.put(tid(3), false, th0) // update in place refreshes and evicts nothing
	assert.Equal(t, []byte{3, 4, 1}, lruOrder(t, c))
	keep, _, known = c.get(tid(3))
	assert.True(t, keep, "a keep is not undone")
	assert.True(t, known)

	c.put(tid(5), true, th0)
	c.put(tid(6), true, th0)
	assert.Equal(t, []byte{6, 5, 3}, lruOrder(t, c))
	assert.Equal(t, 3, c.len())
}

func TestVerdictCacheOfOne(t *testing.T) {
	c := newVerdictCache(1)
	c.put(tid(1), true, th0)
	c.put(tid(1), false, th0)
	assert.Equal(t, []byte{1}, lruOrder(t, c))
	c.put(tid(2), true, th0)
	assert.Equal(t, []byte{2}, lruOrder(t, c))
	_, _, known := c.get(tid(1))
	assert.False(t, known)
}

func TestVerdictCacheDoesNotAllocateInSteadyState(t *testing.T) {
	const size = 1024
	c := newVerdictCache(size)
	ids := make([]pcommon.TraceID, 4*size)
	for i := range ids {
		ids[i] = pcommon.TraceID{byte(i), byte(i >> 8), 0xab, 15: byte(i)}
	}
	// Fill, then churn long enough for Go's map to settle: deletions leave
	// tombstones, and the map may grow once before it reaches a steady size.
	for range 64 {
		for _, id := range ids {
			c.put(id, true, th0)
		}
	}
	n := 0
	allocs := testing.AllocsPerRun(1000, func() {
		c.put(ids[n%len(ids)], n%2 == 0, th0) // always a miss: evicts
		c.get(ids[n%len(ids)])                // hit
		c.get(pcommon.TraceID{0xff})          // miss
		n++
	})
	assert.Zero(t, allocs)
}
