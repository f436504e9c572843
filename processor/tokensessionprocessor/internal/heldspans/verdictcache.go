// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package heldspans // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"

import (
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"go.opentelemetry.io/collector/pdata/pcommon"
)

// verdictCache is a fixed-size LRU of sampling verdicts keyed by trace ID.
// Entries are preallocated and linked by index, most recently used first, so
// get and put are O(1) and allocate nothing once the index has settled: under
// eviction churn Go's map may grow its tables once (tombstones of deleted keys
// count against its load), to about twice the preallocated size, and then
// stays there.
type verdictCache struct {
	index   map[pcommon.TraceID]int32
	entries []verdictEntry
	used    int32 // entries[:used] are in the list
	head    int32 // most recently used, or none
	tail    int32 // least recently used, or none; evicted first
}

type verdictEntry struct {
	id         pcommon.TraceID
	prev, next int32
	keep       bool
	th         sampling.Threshold // of a keep
}

const none int32 = -1

func newVerdictCache(size int) *verdictCache {
	return &verdictCache{
		index:   make(map[pcommon.TraceID]int32, size),
		entries: make([]verdictEntry, size),
		head:    none,
		tail:    none,
	}
}

// get returns the verdict for id and marks it most recently used.
func (c *verdictCache) get(id pcommon.TraceID) (keep bool, th sampling.Threshold, known bool) {
	i, ok := c.index[id]
	if !ok {
		return false, sampling.NeverSampleThreshold, false
	}
	c.toFront(i)
	return c.entries[i].keep, c.entries[i].th, true
}

// put records the verdict for id as most recently used, evicting the least
// recently used entry when the cache is full. A keep is never overwritten by
// a drop, and a kept trace's threshold only goes down: a trace kept once
// stays kept when it calls the model again. It returns the verdict id has
// now, what a get would, so that the caller need not look it up again.
func (c *verdictCache) put(id pcommon.TraceID, keep bool, th sampling.Threshold) (bool, sampling.Threshold) {
	if !keep {
		th = sampling.NeverSampleThreshold
	}
	if i, ok := c.index[id]; ok {
		e := &c.entries[i]
		if keep && (!e.keep || sampling.ThresholdLessThan(th, e.th)) {
			e.th = th
		}
		e.keep = e.keep || keep
		c.toFront(i)
		return e.keep, e.th
	}
	var i int32
	if int(c.used) < len(c.entries) {
		i = c.used
		c.used++
	} else {
		i = c.tail
		c.unlink(i)
		delete(c.index, c.entries[i].id)
	}
	c.entries[i] = verdictEntry{id: id, keep: keep, th: th, prev: none, next: none}
	c.pushFront(i)
	c.index[id] = i
	return keep, th
}

func (c *verdictCache) len() int { return int(c.used) }

func (c *verdictCache) toFront(i int32) {
	if c.head == i {
		return
	}
	c.unlink(i)
	c.pushFront(i)
}

func (c *verdictCache) pushFront(i int32) {
	e := &c.entries[i]
	e.prev = none
	e.next = c.head
	if c.head != none {
		c.entries[c.head].prev = i
	} else {
		c.tail = i
	}
	c.head = i
}

func (c *verdictCache) unlink(i int32) {
	e := &c.entries[i]
	if e.prev != none {
		c.entries[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next != none {
		c.entries[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = none, none
}
