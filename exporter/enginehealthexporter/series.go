// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import (
	"container/list"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
)

// maxSeries bounds the cumulative series whose last point is kept: 64 for
// each engine the judge can know (outcomes, error types, models and the TTFT
// histogram of each).
const maxSeries = 64 * maxEngines

// seriesTable keeps the last point of each cumulative series, so that a
// point counts what it added since the last one. Its series come and go with
// the engines and models that name them; a series is forgotten when nothing
// new came of it for forgetAfter (an unchanged point re-sent at every flush
// is nothing new), and when maxSeries are known a new one takes the place of
// the one that has said nothing new longest: first those that never changed
// since they were first seen, then the others. A forgotten series that
// comes back starts again from a base, as a series seen for the first time.
type seriesTable struct {
	points map[string]*seriesEntry
	// unchanged are the series that have not changed since first seen, by
	// when that was; changed the others, by when they last changed. The
	// oldest of each is at the front.
	unchanged, changed list.List
	forgotten          forgottenCounts
}

// seriesPoint is a cumulative series' last point.
type seriesPoint struct {
	start  pcommon.Timestamp
	value  float64
	counts []uint64 // histogram bucket counts
}

type seriesEntry struct {
	key   string
	point seriesPoint
	// since is when the series last changed, or when it was first seen.
	since time.Time
	el    *list.Element
	list  *list.List
}

func newSeriesTable() *seriesTable {
	return &seriesTable{points: make(map[string]*seriesEntry)}
}

// delta turns a cumulative point into what it adds since the series' last
// point. The first point of a series that began before history only sets
// the base: what it counts is history (the exporter started after the
// collector upstream, or forgot the series). A point that goes backwards, or
// a new start time, is a restart upstream: reset reports it, and the new
// counter's own count is what it adds. counts, when not nil, is a
// histogram's bucket counts, turned into deltas in place (and value is
// ignored).
func (t *seriesTable) delta(key string, start pcommon.Timestamp, value float64, counts *[]uint64, now,
	history time.Time,
) (float64, bool) {
	cur := seriesPoint{start: start, value: value}
	e := t.points[key]
	if e == nil {
		if len(t.points) >= maxSeries {
			t.forgetOldest()
		}
		e = &seriesEntry{key: key, point: cur, since: now, list: &t.unchanged}
		if counts != nil {
			e.point.counts = append([]uint64(nil), (*counts)...)
		}
		e.el = t.unchanged.PushBack(e)
		t.points[key] = e
		if start.AsTime().Before(history) {
			if counts != nil {
				clear(*counts)
			}
			return 0, false
		}
		return value, false
	}
	prev := e.point
	backwards := start != prev.start || value < prev.value
	changed := backwards || value != prev.value
	if counts != nil && !backwards {
		if len(*counts) != len(prev.counts) {
			backwards = true // the buckets changed (an exponential histogram rescaled): start over
		} else {
			for i, c := range *counts {
				if c < prev.counts[i] {
					backwards = true
					break
				}
				changed = changed || c != prev.counts[i]
			}
		}
	}
	if !backwards && !changed {
		if counts != nil {
			clear(*counts)
		}
		return 0, false
	}
	e.since = now
	e.list.Remove(e.el)
	e.list = &t.changed
	e.el = t.changed.PushBack(e)
	e.point.start, e.point.value = start, value
	if backwards {
		if counts != nil {
			e.point.counts = append(e.point.counts[:0], (*counts)...)
		}
		return value, true
	}
	if counts != nil {
		// Same length as the last point's (else backwards): the deltas in
		// place, the raw counts kept.
		for i, c := range *counts {
			(*counts)[i] = c - e.point.counts[i]
			e.point.counts[i] = c
		}
	}
	return value - prev.value, false
}

// forgetOldest forgets the series that has said nothing new longest.
func (t *seriesTable) forgetOldest() {
	el := t.unchanged.Front()
	if el == nil {
		el = t.changed.Front()
	}
	if el != nil {
		t.remove(el.Value.(*seriesEntry))
		t.forgotten.overflow++
	}
}

// forgetIdle forgets the series nothing new came of for d.
func (t *seriesTable) forgetIdle(now time.Time, d time.Duration) {
	for _, l := range []*list.List{&t.unchanged, &t.changed} {
		for el := l.Front(); el != nil; el = l.Front() {
			e := el.Value.(*seriesEntry)
			if now.Sub(e.since) <= d {
				break
			}
			t.remove(e)
			t.forgotten.idle++
		}
	}
}

func (t *seriesTable) remove(e *seriesEntry) {
	e.list.Remove(e.el)
	delete(t.points, e.key)
}
