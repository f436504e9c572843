// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/internal/exphist"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// The heap keeps the k highest keys of any sequence.
func TestWorstHeap(t *testing.T) {
	keys := []int64{5, 1, 9, 3, 7, 9, 2, 8, 6, 4, 0}
	h := worstHeap{k: 4}
	for _, k := range keys {
		h.offer(liveCandidate{key: k})
	}
	var got []int64
	for _, c := range h.items {
		got = append(got, c.key)
	}
	slices.Sort(got)
	assert.Equal(t, []int64{7, 8, 9, 9}, got)
}

// The bucket of a TTFT is the one exphist's bounds say holds it: (lower,
// upper], a power of two in the bucket below it.
func TestTTFTBucket(t *testing.T) {
	for _, d := range []time.Duration{
		time.Millisecond, 2 * time.Second, time.Second, 1500 * time.Millisecond, 1189 * time.Millisecond,
		1190 * time.Millisecond, 77 * time.Millisecond, 123456 * time.Microsecond, 3 * time.Minute,
	} {
		var h ttftHist
		h.add(d)
		i := slices.IndexFunc(h[:], func(c uint32) bool { return c == 1 })
		lower, upper := exphist.Bounds(ttftScale, int32(i+ttftOffset))
		assert.True(t, d.Seconds() > lower && d.Seconds() <= upper, "%s in (%g, %g]", d, lower, upper)
	}
}

// The page cuts a long name in its cell, with an ellipsis, and shows it
// whole on hover; the table is not stretched.
func TestLivePageCutsLongNames(t *testing.T) {
	page := string(livePage)
	assert.Regexp(t, `\.cut, \.ename \{[^}]*max-width: \d+px;[^}]*overflow: hidden;[^}]*text-overflow: ellipsis;`, page)
	assert.Contains(t, page, `function cell(cls, text)`, "every name cell made by cell(), which cuts it and sets its title")
	assert.NotRegexp(t, `el\("td", [^,]*, [se]\.(id|engine|model|operation|attributes|error_type)`, page, "no name cell left uncut")
}

// liveCount is the sum of the counter name's points in tel.
func liveCount(t *testing.T, tel *componenttest.Telemetry, name string) int64 {
	t.Helper()
	m, err := tel.GetMetric(name)
	if err != nil {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		n += dp.Value
	}
	return n
}

// At 100 000 sessions in flight, each on an engine of its own with a
// 100-byte name, a snapshot stays within its bounds: max_engines engines,
// the rest counted, the JSON and the memory a pass allocates bounded
// whatever the number of engines. Ended, they leave at most
// maxLiveTTFTKeys TTFT minutes, the rest counted.
func TestLiveHundredThousandEngines(t *testing.T) {
	const n = 100_000
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	h := newHarness(t, tel, func(l *Config) { l.Interval = time.Second })
	engine := func(i int) string { return fmt.Sprintf("%0100d", i) }
	evs := make([]tokenevent.Event, 0, n)
	for i := range n {
		evs = append(evs, start(fmt.Sprintf("s%06d", i), engine(i), "llama", base))
	}
	h.fold(base, evs...)
	require.Equal(t, n, h.table.Active())
	now := time.Unix(0, base+time.Second.Nanoseconds())

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	body := h.state.snapshot(now, Filter{}, &liveScan{})
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("one snapshot of %d sessions on as many engines: %d B of JSON, %d B allocated", n, len(body), allocated)
	var snap Snapshot
	require.NoError(t, json.Unmarshal(body, &snap))
	assert.Len(t, snap.Sessions, 500)
	assert.Len(t, snap.Engines, 64)
	assert.Equal(t, maxLiveCells-64, snap.EnginesLeftOut, "the engines tallied and not listed")
	assert.Equal(t, n-maxLiveCells, snap.SessionsUntallied, "the sessions of the engines past maxLiveCells")
	assert.Less(t, len(body), 512<<10, "the snapshot's JSON")
	assert.Less(t, allocated, uint64(16<<20), "what the pass allocates")
	assert.Equal(t, int64(n-maxLiveCells), liveCount(t, tel, "otelcol_processor_token_session_live_sessions_untallied"))

	body = h.state.snapshot(now, Filter{Model: "no-such-model"}, &liveScan{})
	require.NoError(t, json.Unmarshal(body, &snap))
	assert.Empty(t, snap.Engines)
	assert.Zero(t, snap.EnginesLeftOut)
	assert.Less(t, len(body), 1<<10, "a filter that picks nothing: %s", body)

	// Each ends with a TTFT: the engines' minutes keep maxLiveTTFTKeys.
	evs = evs[:0]
	for i := range n {
		id := fmt.Sprintf("s%06d", i)
		evs = append(evs, tok(id, base+100*ms, 1), end(id, base+200*ms))
	}
	h.fold(base+200*ms, evs...)
	require.Zero(t, h.table.Active())
	assert.Len(t, h.state.ttft, maxLiveTTFTKeys)
	assert.Equal(t, int64(n-maxLiveTTFTKeys), liveCount(t, tel, "otelcol_processor_token_session_live_ttfts_overflowed"))
	body = h.state.snapshot(now, Filter{}, &liveScan{})
	require.NoError(t, json.Unmarshal(body, &snap))
	assert.Len(t, snap.Engines, 64)
	assert.Equal(t, maxLiveTTFTKeys-64, snap.EnginesLeftOut)
	assert.Len(t, snap.Recent, 100)
	assert.Equal(t, int64(3), liveCount(t, tel, "otelcol_processor_token_session_live_scans"))
}

// A name of any length is shown cut to liveMaxName bytes, on a rune
// boundary, and filtered by what is shown; the ring of ended sessions
// keeps the cut names, not the long ones.
func TestLiveLongNamesCut(t *testing.T) {
	h := newHarness(t, nil, func(l *Config) { l.Attributes = []string{"tenant"} })
	long := func(prefix string) string { return prefix + strings.Repeat("é", 6000) } // 12 000 bytes and more
	ev := start(long("id-"), long("engine-"), long("model-"), base)
	ev.Operation = long("op-")
	ev.Attributes = []tokenevent.Attribute{{Key: "tenant", Value: long("tenant-")}}
	ended := start(long("ended-"), long("engine-"), long("model-"), base)
	endEv := end(ended.SessionID, base+200*ms)
	endEv.Error = long("error-")
	h.feed(ev, tok(ev.SessionID, base+100*ms, 1), ended, tok(ended.SessionID, base+100*ms, 1), endEv)

	now := time.Unix(0, base+time.Second.Nanoseconds())
	body := h.state.snapshot(now, Filter{}, &liveScan{})
	assert.Less(t, len(body), 8<<10, "the snapshot of two sessions with 12 000-byte names")
	var snap Snapshot
	require.NoError(t, json.Unmarshal(body, &snap))
	require.Len(t, snap.Sessions, 1)
	require.Len(t, snap.Recent, 1)
	require.Len(t, snap.Engines, 1)
	row, gone := snap.Sessions[0], snap.Recent[0]
	for _, name := range []string{
		row.ID, row.Engine, row.Model, row.Operation, row.Attributes["tenant"],
		gone.ID, gone.Engine, gone.Model, gone.ErrorType, snap.Engines[0].Engine,
	} {
		assert.LessOrEqual(t, len(name), liveMaxName+len(liveCut))
		assert.True(t, strings.HasSuffix(name, liveCut), name)
		assert.True(t, utf8.ValidString(name), "cut on a rune boundary")
	}
	assert.Equal(t, liveName(ev.Engine), row.Engine)

	// Filtered by the name shown.
	snap = h.take(t, now, Filter{Engine: row.Engine, Model: row.Model})
	assert.Equal(t, 1, snap.Matching)
	assert.Len(t, snap.Engines, 1)
	assert.Len(t, snap.Recent, 1)

	// The ring's strings are the cut ones, not the session's.
	r := h.state.recent[0]
	for _, name := range []string{r.id, r.engine, r.model, r.errorType} {
		assert.LessOrEqual(t, len(name), liveMaxName+len(liveCut))
	}
}
