// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/sampling"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

const ms = int64(time.Millisecond)

// t0 is an engine time; the collector clock in these tests is the same
// clock, so arrival = event time unless a test says otherwise.
const t0 = int64(1_700_000_000_000_000_000)

// ended is what the observer saw at a session's end, copied out.
type ended struct {
	ID            string
	Outcome       Outcome
	TTFT, TPOT    time.Duration
	HasTTFT       bool
	HasTPOT       bool
	Window, WMax  time.Duration
	MaxGap        time.Duration
	Tokens        int64
	Chunks        int32
	Stalls        int
	Freezes       int
	Keep          bool
	Moves         []Move
	Reasons       Reason
	Threshold     sampling.Threshold
	Duration      time.Duration
	End           End
	Trace         TraceVerdict
	StallRecords  []Stall
	HasStart      bool
	Model, Engine string
}

type recorder struct {
	started   []string
	restarted []string
	gaps      []string
	firsts    []string
	stalls    []Stall
	early     []string
	// earlyAt is the At of each early keep reported.
	earlyAt []int64
	ended   []ended
}

func (r *recorder) Started(s *Session, _ *struct{}) {
	r.started = append(r.started, s.ID)
}

func (r *recorder) Restarted(s *Session, _ *struct{}) {
	r.restarted = append(r.restarted, s.ID+" "+s.Model+" "+s.Engine)
}

func (r *recorder) Gap(s *Session, _ *struct{}, g time.Duration, n int64) {
	r.gaps = append(r.gaps, fmt.Sprintf("%s %v×%d", s.ID, g, n))
}

func (r *recorder) FirstToken(s *Session, _ *struct{}) {
	r.firsts = append(r.firsts, fmt.Sprintf("%s %d", s.ID, s.FirstTokenTime))
}

// record copies out what the reports tell, as the processor reads them
// after each call.
func (r *recorder) record(reports []Report[struct{}]) {
	for i := range reports {
		rp := &reports[i]
		s := rp.Session
		switch rp.Kind {
		case ReportStalled:
			c := rp.Stall
			c.Gaps = append([]time.Duration(nil), rp.Stall.Gaps...)
			r.stalls = append(r.stalls, c)
		case ReportKeptEarly:
			r.early = append(r.early, s.ID)
			r.earlyAt = append(r.earlyAt, rp.At)
		case ReportEnded:
			e := &rp.End
			ttft, hasTTFT := s.TTFT()
			tpot, hasTPOT := s.TPOT(e.CompletionTokens)
			w, _ := s.WindowTPOT()
			r.ended = append(r.ended, ended{
				ID: s.ID, Outcome: s.Outcome, TTFT: ttft, HasTTFT: hasTTFT, TPOT: tpot, HasTPOT: hasTPOT,
				Window: w, WMax: s.WindowTPOTMax, MaxGap: s.MaxGap, Tokens: s.Tokens, Chunks: s.Chunks, Stalls: int(s.StallCount),
				Freezes: int(s.Freezes), Keep: s.Keep, Reasons: s.Reasons, Threshold: s.Threshold, Duration: s.Duration(e), End: *e, Trace: rp.Trace,
				StallRecords: append([]Stall(nil), s.Stalls()...), HasStart: s.HasStart, Model: s.Model, Engine: s.Engine,
				Moves: append([]Move(nil), s.Moves()...),
			})
		}
	}
}

// testTable is a Table whose reports go to its recorder after every call,
// then back to the table.
type testTable struct {
	*Table[struct{}]
	rec     *recorder
	reports []Report[struct{}]
}

func (tt *testTable) handle(reports []Report[struct{}]) {
	tt.rec.record(reports)
	tt.reports = tt.Release(reports)
}

func (tt *testTable) Apply(ev *tokenevent.Event, now int64) {
	tt.handle(tt.Table.Apply(ev, now, tt.reports))
}

func (tt *testTable) Tick(now int64) { tt.handle(tt.Table.Tick(now, tt.reports)) }

func (tt *testTable) Shutdown(now int64) { tt.handle(tt.Table.Shutdown(now, tt.reports)) }

func newTable(t *testing.T, mutate func(*Config)) (*testTable, *recorder) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Sampling.NormalPercent = 0 // only rules keep, unless a test says otherwise
	if mutate != nil {
		mutate(&cfg)
	}
	rec := &recorder{}
	tbl, err := NewTable(cfg, rec)
	require.NoError(t, err)
	return &testTable{Table: tbl, rec: rec}, rec
}

func start(id string, at int64) *tokenevent.Event {
	return &tokenevent.Event{Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: uint64(at), Model: "m", Engine: "e", PromptTokens: 10, Count: 1, CompletionTokens: -1}
}

func tok(id string, at, count int64) *tokenevent.Event {
	return &tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(at), Count: count, PromptTokens: -1, CompletionTokens: -1}
}

func end(id string, at, completion int64) *tokenevent.Event {
	return &tokenevent.Event{Kind: tokenevent.KindEnd, SessionID: id, TimeUnixNano: uint64(at), CompletionTokens: completion, FinishReason: "stop", PromptTokens: -1, Count: 1}
}

// move is a move of the session to "vllm-1:8000", for a stall, carrying
// 3 tokens.
func move(id string, at int64) *tokenevent.Event {
	return &tokenevent.Event{
		Kind: tokenevent.KindMove, SessionID: id, TimeUnixNano: uint64(at), Engine: "vllm-1:8000", Error: "engine_stalled", Count: 3,
		PromptTokens: -1, CompletionTokens: -1,
	}
}

// A session keeps its moves in the order they came, the first
// tokenevent.MaxMigrations; one beyond is dropped and counted.
func TestMoves(t *testing.T) {
	tbl, rec := newTable(t, nil)
	apply(tbl, start("x", t0), tok("x", t0+10*ms, 3), move("x", t0+20*ms))
	second := move("x", t0+30*ms)
	second.Engine, second.Error, second.Count = "vllm-2:8000", "upstream_stream_broken", 0
	apply(tbl, second)
	for i := range tokenevent.MaxMigrations - 1 {
		apply(tbl, move("x", t0+40*ms+int64(i)))
	}
	apply(tbl, tok("x", t0+200*ms, 1), end("x", t0+210*ms, 4))
	require.Len(t, rec.ended, 1)
	moves := rec.ended[0].Moves
	require.Len(t, moves, tokenevent.MaxMigrations)
	assert.Equal(t, Move{Time: t0 + 20*ms, To: "vllm-1:8000", Reason: "engine_stalled", TokensCarried: 3}, moves[0])
	assert.Equal(t, Move{Time: t0 + 30*ms, To: "vllm-2:8000", Reason: "upstream_stream_broken"}, moves[1])
	assert.Equal(t, uint64(1), tbl.Counters.ExcessMoves)
	assert.Equal(t, int64(4), rec.ended[0].Tokens, "a move is no token")

	// The Session is reused: the next one starts with no moves.
	apply(tbl, start("y", t0+300*ms), end("y", t0+310*ms, 0))
	require.Len(t, rec.ended, 2)
	assert.Empty(t, rec.ended[1].Moves)
}

// apply feeds events with the arrival clock equal to the event time.
func apply(tbl *testTable, evs ...*tokenevent.Event) {
	for _, ev := range evs {
		tbl.Apply(ev, int64(ev.TimeUnixNano))
	}
}

// The sessions here have fewer gaps than the window (10): no window is
// full, so none has a WindowTPOTMax (TestWindowTPOT has them).
func TestFigures(t *testing.T) {
	tests := []struct {
		name   string
		events []*tokenevent.Event
		want   ended
	}{
		{
			// TTFT 200 ms; gaps 20, 30, 40 ms; TPOT (290-200)/3 = 30 ms.
			name:   "single tokens",
			events: []*tokenevent.Event{start("a", t0), tok("a", t0+200*ms, 1), tok("a", t0+220*ms, 1), tok("a", t0+250*ms, 1), tok("a", t0+290*ms, 1), end("a", t0+300*ms, -1)},
			want: ended{
				ID: "a", Outcome: OutcomeCompleted, TTFT: 200 * time.Millisecond, HasTTFT: true, TPOT: 30 * time.Millisecond, HasTPOT: true,
				Window: 30 * time.Millisecond, MaxGap: 40 * time.Millisecond, Tokens: 4, Chunks: 4, Duration: 300 * time.Millisecond,
			},
		},
		{
			// A chunk of 4 tokens 80 ms after the first: 4 per-token gaps of 20 ms.
			// completion_tokens (6) overrides the sum of counts (5) for TPOT: 80/5 = 16 ms.
			name:   "multi-token chunk and completion_tokens",
			events: []*tokenevent.Event{start("b", t0), tok("b", t0+100*ms, 1), tok("b", t0+180*ms, 4), end("b", t0+181*ms, 6)},
			want: ended{
				ID: "b", Outcome: OutcomeCompleted, TTFT: 100 * time.Millisecond, HasTTFT: true, TPOT: 16 * time.Millisecond, HasTPOT: true,
				Window: 20 * time.Millisecond, MaxGap: 20 * time.Millisecond, Tokens: 5, Chunks: 2, Duration: 181 * time.Millisecond,
			},
		},
		{
			name:   "one token: no TPOT",
			events: []*tokenevent.Event{start("c", t0), tok("c", t0+50*ms, 1), end("c", t0+60*ms, 1)},
			want: ended{
				ID: "c", Outcome: OutcomeCompleted, TTFT: 50 * time.Millisecond, HasTTFT: true, Tokens: 1, Chunks: 1,
				Duration: 60 * time.Millisecond,
			},
		},
		{
			name:   "no token: no TTFT",
			events: []*tokenevent.Event{start("d", t0), {Kind: tokenevent.KindEnd, SessionID: "d", TimeUnixNano: uint64(t0 + 5*ms), Error: "upstream_500", CompletionTokens: -1}},
			want:   ended{ID: "d", Outcome: OutcomeError, Keep: true, Reasons: ReasonError, Duration: 5 * time.Millisecond},
		},
		{
			name:   "aborted",
			events: []*tokenevent.Event{start("e", t0), tok("e", t0+10*ms, 1), {Kind: tokenevent.KindEnd, SessionID: "e", TimeUnixNano: uint64(t0 + 20*ms), FinishReason: "abort", CompletionTokens: -1}},
			want:   ended{ID: "e", Outcome: OutcomeAborted, TTFT: 10 * time.Millisecond, HasTTFT: true, Tokens: 1, Chunks: 1, Duration: 20 * time.Millisecond},
		},
		{
			// The proxy cut the stream at shutdown: ended as shutdown, not as an error.
			name:   "cut at the source's shutdown",
			events: []*tokenevent.Event{start("s", t0), tok("s", t0+10*ms, 1), {Kind: tokenevent.KindEnd, SessionID: "s", TimeUnixNano: uint64(t0 + 20*ms), Error: tokenevent.ErrorShutdown, CompletionTokens: -1}},
			want:   ended{ID: "s", Outcome: OutcomeShutdown, TTFT: 10 * time.Millisecond, HasTTFT: true, Tokens: 1, Chunks: 1, Duration: 20 * time.Millisecond},
		},
		{
			// TTFT 600 ms > 500 ms: kept (early, at the first token).
			name:   "slow TTFT",
			events: []*tokenevent.Event{start("f", t0), tok("f", t0+600*ms, 1), tok("f", t0+610*ms, 1), end("f", t0+610*ms, 2)},
			want: ended{
				ID: "f", Outcome: OutcomeCompleted, TTFT: 600 * time.Millisecond, HasTTFT: true, TPOT: 10 * time.Millisecond, HasTPOT: true,
				Window: 10 * time.Millisecond, MaxGap: 10 * time.Millisecond, Tokens: 2, Chunks: 2, Keep: true, Reasons: ReasonTTFT, Duration: 610 * time.Millisecond,
			},
		},
		{
			// TPOT (100+100)/2 = 100 ms > 80 ms, but no gap above 150 ms: no stall.
			name:   "slow TPOT",
			events: []*tokenevent.Event{start("g", t0), tok("g", t0+10*ms, 1), tok("g", t0+110*ms, 1), tok("g", t0+210*ms, 1), end("g", t0+210*ms, -1)},
			want: ended{
				ID: "g", Outcome: OutcomeCompleted, TTFT: 10 * time.Millisecond, HasTTFT: true, TPOT: 100 * time.Millisecond, HasTPOT: true,
				Window: 100 * time.Millisecond, MaxGap: 100 * time.Millisecond, Tokens: 3, Chunks: 3, Keep: true, Reasons: ReasonTPOT, Duration: 210 * time.Millisecond,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, rec := newTable(t, nil)
			apply(tbl, tt.events...)
			require.Len(t, rec.ended, 1)
			got := rec.ended[0]
			got.End, got.Trace, got.StallRecords, got.Model, got.Engine, got.HasStart = End{}, TraceVerdict{}, nil, "", "", false
			want := tt.want
			if want.Keep {
				want.Threshold = sampling.AlwaysSampleThreshold
			} else {
				want.Threshold = sampling.NeverSampleThreshold
			}
			assert.Equal(t, want, got)
			assert.Zero(t, tbl.Active())
		})
	}
}

func TestWindowTPOT(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Window = 3 })
	// gaps: 10, 20, 30, 60 ms → windows: 10, 15, 20, (20+30+60)/3 ≈ 36.666 ms
	apply(tbl, start("w", t0), tok("w", t0+100*ms, 1), tok("w", t0+110*ms, 1), tok("w", t0+130*ms, 1), tok("w", t0+160*ms, 1), tok("w", t0+220*ms, 1), end("w", t0+220*ms, -1))
	require.Len(t, rec.ended, 1)
	assert.Equal(t, 36666*time.Microsecond, rec.ended[0].Window)
	assert.Equal(t, 36666*time.Microsecond, rec.ended[0].WMax)
	assert.Equal(t, []string{"w 10ms×1", "w 20ms×1", "w 30ms×1", "w 60ms×1"}, rec.gaps)
}

// The gap windows live in the table's dense array, by slot; ending a session
// moves the last slot's session, with its window, into the freed slot.
func TestWindowMovesWithItsSession(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Window = 3; c.Sampling.Stalls = false })
	apply(tbl, start("a", t0), start("b", t0), start("c", t0))
	apply(tbl, tok("a", t0+10*ms, 1), tok("b", t0+10*ms, 1), tok("c", t0+10*ms, 1))
	// Gaps: a 5 ms, b 20 ms, c 160 ms (slow, twice: one short of a stall).
	apply(tbl, tok("a", t0+15*ms, 1), tok("b", t0+30*ms, 1), tok("c", t0+170*ms, 1))
	apply(tbl, tok("b", t0+50*ms, 1), tok("c", t0+330*ms, 1))
	// a ends: c moves from the last slot into a's.
	apply(tbl, end("a", t0+400*ms, -1))
	require.Len(t, rec.ended, 1)
	assert.Equal(t, 5*time.Millisecond, rec.ended[0].Window)
	// c's third slow gap completes a stall whose gaps come from its window,
	// the two before the move included.
	apply(tbl, tok("c", t0+490*ms, 1), tok("b", t0+500*ms, 1))
	require.Len(t, rec.stalls, 1)
	assert.Equal(t, []time.Duration{160 * time.Millisecond, 160 * time.Millisecond, 160 * time.Millisecond}, rec.stalls[0].Gaps)
	// A new session takes the freed slot at the end with a clean window.
	apply(tbl, start("d", t0+500*ms), tok("d", t0+510*ms, 1), tok("d", t0+511*ms, 1))
	apply(tbl, end("b", t0+600*ms, -1), end("c", t0+600*ms, -1), end("d", t0+600*ms, -1))
	require.Len(t, rec.ended, 4)
	// b: 20, 20, 450 ms; c: 160 ms ×3; d: 1 ms.
	assert.Equal(t, 163333*time.Microsecond, rec.ended[1].Window)
	assert.Equal(t, 160*time.Millisecond, rec.ended[2].Window)
	assert.Equal(t, time.Millisecond, rec.ended[3].Window)
}

// A Session is reused after its end; the next session in it starts without
// the previous one's attributes and stall records.
func TestReusedSessionStartsEmpty(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Stall.Consecutive = 1 })
	withAttrs := start("x", t0)
	withAttrs.Attributes = []tokenevent.Attribute{{Key: "tenant", Value: "t1"}}
	var attrs []tokenevent.Attribute
	apply(tbl, withAttrs, tok("x", t0+10*ms, 1), tok("x", t0+300*ms, 1))
	attrs = append(attrs, tbl.lookup("x").Attributes()...)
	apply(tbl, end("x", t0+300*ms, -1))
	require.Len(t, rec.ended, 1)
	assert.Len(t, rec.ended[0].StallRecords, 1)
	assert.Equal(t, []tokenevent.Attribute{{Key: "tenant", Value: "t1"}}, attrs)

	apply(tbl, start("y", t0+400*ms), tok("y", t0+410*ms, 1))
	y := tbl.lookup("y")
	assert.Empty(t, y.Attributes())
	assert.Empty(t, y.Stalls())
	apply(tbl, end("y", t0+500*ms, -1))
	require.Len(t, rec.ended, 2)
	assert.Zero(t, rec.ended[1].Stalls)
	assert.Empty(t, rec.ended[1].StallRecords)
}

func TestStallEpisodes(t *testing.T) {
	tbl, rec := newTable(t, nil)
	at := t0
	events := []*tokenevent.Event{start("s", at), tok("s", at+10*ms, 1)}
	at += 10 * ms
	// Two slow gaps (K-1): no stall.
	for range 2 {
		at += 200 * ms
		events = append(events, tok("s", at, 1))
	}
	at += 10 * ms
	events = append(events, tok("s", at, 1))
	apply(tbl, events...)
	assert.Empty(t, rec.stalls, "K-1 slow gaps are not a stall")

	// Five slow gaps: one alert, at the third.
	for i := range 5 {
		at += 160 * ms
		apply(tbl, tok("s", at, 1))
		if i == 2 {
			require.Len(t, rec.stalls, 1)
			assert.Equal(t, Stall{DetectedAt: at, Since: at - 480*ms, Gaps: []time.Duration{160 * time.Millisecond, 160 * time.Millisecond, 160 * time.Millisecond}}, rec.stalls[0])
			assert.Equal(t, []string{"s"}, rec.early, "a stall keeps the session at once")
		}
	}
	assert.Len(t, rec.stalls, 1, "one alert per episode")
	// A fast gap ends the episode; the next three slow gaps are a second one.
	at += 10 * ms
	apply(tbl, tok("s", at, 1))
	for range 3 {
		at += 151 * ms
		apply(tbl, tok("s", at, 1))
	}
	assert.Len(t, rec.stalls, 2)
	// A chunk of 3 tokens 600 ms after the last: 3 slow per-token gaps of 200 ms.
	at += 10 * ms
	apply(tbl, tok("s", at, 1), tok("s", at+600*ms, 3))
	at += 600 * ms
	require.Len(t, rec.stalls, 3)
	assert.Equal(t, at, rec.stalls[2].DetectedAt)
	apply(tbl, end("s", at, -1))
	require.Len(t, rec.ended, 1)
	assert.Equal(t, 3, rec.ended[0].Stalls)
	assert.Len(t, rec.ended[0].StallRecords, 3)
	assert.True(t, rec.ended[0].Keep)
	assert.Equal(t, ReasonStall|ReasonTPOT, rec.ended[0].Reasons)
	assert.Equal(t, []string{"s"}, rec.early, "kept early once")
}

func TestStallSinceIsTheLastTokenBeforeTheEpisode(t *testing.T) {
	tbl, rec := newTable(t, nil)
	apply(tbl, start("s", t0), tok("s", t0+10*ms, 1), tok("s", t0+30*ms, 1),
		tok("s", t0+230*ms, 1), tok("s", t0+480*ms, 1), tok("s", t0+780*ms, 1))
	require.Len(t, rec.stalls, 1)
	assert.Equal(t, Stall{
		DetectedAt: t0 + 780*ms, Since: t0 + 30*ms,
		Gaps: []time.Duration{200 * time.Millisecond, 250 * time.Millisecond, 300 * time.Millisecond},
	}, rec.stalls[0])
}

func TestFreezeDetectedWhileItLasts(t *testing.T) {
	// No delivery slack: the lone session's source is judged at once on
	// the arrival clock (TestFreezeOnEngineTime has the slack).
	tbl, rec := newTable(t, func(c *Config) { c.Stall.DeliverySlack = 0 })
	apply(tbl, start("f", t0), tok("f", t0+10*ms, 1), tok("f", t0+20*ms, 1))
	tbl.Tick(t0 + 400*ms) // 380 ms without a token: below 3×150 ms
	assert.Empty(t, rec.stalls)
	tbl.Tick(t0 + 471*ms) // 451 ms: frozen
	require.Len(t, rec.stalls, 1)
	assert.Equal(t, Stall{DetectedAt: t0 + 470*ms, Since: t0 + 20*ms, Freeze: true}, rec.stalls[0])
	tbl.Tick(t0 + 900*ms)
	assert.Len(t, rec.stalls, 1, "one alert per episode")
	// Decoding resumes slowly: still the same episode; a fast gap ends it.
	apply(tbl, tok("f", t0+1000*ms, 1), tok("f", t0+1200*ms, 1), tok("f", t0+1210*ms, 1))
	assert.Len(t, rec.stalls, 1)
	// A second freeze is a second episode.
	tbl.Tick(t0 + 1700*ms)
	assert.Len(t, rec.stalls, 2)
	// A session before its first token is waiting for prefill, not frozen.
	apply(tbl, start("q", t0+1700*ms))
	tbl.Tick(t0 + 5000*ms)
	assert.Len(t, rec.stalls, 2)
}

func TestIdleTimeout(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Table.IdleTimeout = time.Second })
	apply(tbl, start("old", t0), tok("old", t0+10*ms, 1))
	apply(tbl, start("new", t0+600*ms))
	tbl.Tick(t0 + 1000*ms)
	assert.Empty(t, rec.ended)
	tbl.Tick(t0 + 1011*ms)
	require.Len(t, rec.ended, 1)
	assert.Equal(t, "old", rec.ended[0].ID)
	assert.Equal(t, OutcomeTimeout, rec.ended[0].Outcome)
	assert.Equal(t, ReasonTimeout, rec.ended[0].Reasons&ReasonTimeout)
	assert.Equal(t, 10*time.Millisecond, rec.ended[0].Duration)
	// Activity keeps a session alive.
	apply(tbl, tok("new", t0+1500*ms, 1))
	tbl.Tick(t0 + 2400*ms)
	assert.Len(t, rec.ended, 1)
	tbl.Tick(t0 + 2501*ms)
	require.Len(t, rec.ended, 2)
	assert.Equal(t, "new", rec.ended[1].ID)
	assert.Zero(t, tbl.Active())
}

func TestEvictionLeastRecentlyActive(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Table.MaxActive = 2 })
	apply(tbl, start("a", t0), start("b", t0+1*ms), tok("a", t0+2*ms, 1), start("c", t0+3*ms))
	require.Len(t, rec.ended, 1)
	assert.Equal(t, "b", rec.ended[0].ID)
	assert.Equal(t, OutcomeEvicted, rec.ended[0].Outcome)
	assert.Equal(t, 2, tbl.Active())
}

// A session ended by an eviction is reported from inside Apply; the new
// session of the same call must not reuse it before the caller has read the
// report and released it.
func TestReportedSessionReusedOnlyAfterRelease(t *testing.T) {
	tbl, err := NewTable(DefaultConfig(), &recorder{})
	require.NoError(t, err)
	tbl.cfg.Table.MaxActive = 1
	reports := tbl.Release(tbl.Apply(start("a", t0), t0, nil))
	reports = tbl.Apply(start("b", t0+ms), t0+ms, reports)
	require.Len(t, reports, 1)
	a := reports[0].Session
	assert.Equal(t, ReportEnded, reports[0].Kind)
	assert.Equal(t, "a", a.ID, "the evicted session, intact")
	assert.Equal(t, OutcomeEvicted, a.Outcome)
	assert.NotSame(t, a, &tbl.lookup("b").Session)
	reports = tbl.Release(reports)
	assert.Empty(t, reports)
	reports = tbl.Apply(start("c", t0+2*ms), t0+2*ms, reports)
	require.Len(t, reports, 1)
	assert.Equal(t, "b", reports[0].Session.ID)
	assert.Same(t, a, &tbl.lookup("c").Session, "released, then reused")
}

// Reports of one batch are handled after it: a stall report carries the
// session's counts at detection, not those of the tokens after it.
func TestStallReportCountsAtDetection(t *testing.T) {
	tbl, err := NewTable(DefaultConfig(), &recorder{})
	require.NoError(t, err)
	var reports []Report[struct{}]
	for _, ev := range []*tokenevent.Event{
		start("s", t0), tok("s", t0+10*ms, 1), tok("s", t0+210*ms, 1), tok("s", t0+410*ms, 1),
		tok("s", t0+610*ms, 1), tok("s", t0+620*ms, 1), tok("s", t0+630*ms, 1),
	} {
		reports = tbl.Apply(ev, int64(ev.TimeUnixNano), reports)
	}
	require.Len(t, reports, 2)
	assert.Equal(t, ReportStalled, reports[0].Kind)
	assert.Equal(t, 1, reports[0].StallCount)
	assert.Equal(t, int32(4), reports[0].Chunks)
	assert.Equal(t, ReportKeptEarly, reports[1].Kind)
	assert.Equal(t, int32(6), reports[0].Session.Chunks)
}

func TestShutdownEndsAll(t *testing.T) {
	tbl, rec := newTable(t, nil)
	apply(tbl, start("a", t0), start("b", t0), tok("b", t0+5*ms, 1))
	tbl.Shutdown(t0 + 10*int64(time.Second))
	require.Len(t, rec.ended, 2)
	for _, e := range rec.ended {
		assert.Equal(t, OutcomeShutdown, e.Outcome)
	}
	assert.Zero(t, tbl.Active())
	assert.Zero(t, tbl.traces.used)
	assert.Empty(t, tbl.traceRecords)
}

func TestDisorder(t *testing.T) {
	t.Run("token before start", func(t *testing.T) {
		tbl, rec := newTable(t, nil)
		apply(tbl, tok("x", t0+100*ms, 1), start("x", t0), tok("x", t0+120*ms, 1), end("x", t0+120*ms, -1))
		assert.Equal(t, uint64(1), tbl.Counters.OrphanTokens)
		require.Len(t, rec.ended, 1)
		assert.True(t, rec.ended[0].HasStart)
		assert.Equal(t, "m", rec.ended[0].Model)
		assert.Equal(t, 100*time.Millisecond, rec.ended[0].TTFT)
		assert.Equal(t, 20*time.Millisecond, rec.ended[0].TPOT)
	})
	t.Run("start never arrives", func(t *testing.T) {
		tbl, rec := newTable(t, nil)
		apply(tbl, tok("x", t0+100*ms, 1), tok("x", t0+120*ms, 1), end("x", t0+120*ms, -1))
		require.Len(t, rec.ended, 1)
		assert.False(t, rec.ended[0].HasStart)
		assert.False(t, rec.ended[0].HasTTFT)
		assert.Equal(t, 20*time.Millisecond, rec.ended[0].Duration)
	})
	t.Run("events after the end", func(t *testing.T) {
		tbl, rec := newTable(t, nil)
		apply(tbl, start("x", t0), tok("x", t0+10*ms, 1), end("x", t0+20*ms, -1))
		apply(tbl, tok("x", t0+30*ms, 1), end("x", t0+20*ms, -1), start("x", t0))
		assert.Equal(t, uint64(3), tbl.Counters.LateEvents)
		assert.Len(t, rec.ended, 1)
		assert.Zero(t, tbl.Active(), "late events open no session")
	})
	t.Run("end of an unknown session", func(t *testing.T) {
		tbl, rec := newTable(t, nil)
		apply(tbl, end("ghost", t0, -1), end("ghost", t0, -1))
		assert.Equal(t, uint64(1), tbl.Counters.OrphanEnds)
		assert.Equal(t, uint64(1), tbl.Counters.LateEvents)
		assert.Empty(t, rec.started)
		assert.Zero(t, tbl.Active())
	})
	t.Run("move of an unknown session", func(t *testing.T) {
		tbl, rec := newTable(t, nil)
		apply(tbl, move("ghost", t0), start("ghost", t0+ms), end("ghost", t0+2*ms, -1), move("ghost", t0+3*ms))
		assert.Equal(t, uint64(1), tbl.Counters.OrphanMoves, "before its start: opens nothing")
		assert.Equal(t, uint64(1), tbl.Counters.LateEvents, "after its end")
		require.Len(t, rec.ended, 1)
		assert.Empty(t, rec.ended[0].Moves)
	})
	t.Run("duplicate start", func(t *testing.T) {
		tbl, rec := newTable(t, nil)
		apply(tbl, start("x", t0), start("x", t0+5*ms), tok("x", t0+10*ms, 1), end("x", t0+10*ms, -1))
		assert.Equal(t, uint64(1), tbl.Counters.DuplicateStarts)
		assert.Equal(t, 10*time.Millisecond, rec.ended[0].TTFT, "the first start counts")
	})
	t.Run("time going backwards", func(t *testing.T) {
		tbl, rec := newTable(t, nil)
		apply(tbl, start("x", t0), tok("x", t0+100*ms, 1), tok("x", t0+150*ms, 1), tok("x", t0+90*ms, 1), tok("x", t0+170*ms, 1), end("x", t0+170*ms, -1))
		assert.Equal(t, uint64(1), tbl.Counters.OutOfOrder)
		require.Len(t, rec.ended, 1)
		e := rec.ended[0]
		assert.Equal(t, 90*time.Millisecond, e.TTFT, "the earliest token is the first")
		assert.Equal(t, int64(4), e.Tokens)
		assert.Equal(t, 50*time.Millisecond, e.MaxGap, "no negative gap")
		assert.Equal(t, (80*time.Millisecond)/3, e.TPOT)
	})
	t.Run("token before its start time", func(t *testing.T) {
		tbl, rec := newTable(t, nil)
		apply(tbl, start("x", t0), tok("x", t0-5*ms, 1), end("x", t0, -1))
		assert.Equal(t, uint64(1), tbl.Counters.OutOfOrder)
		assert.Equal(t, time.Duration(0), rec.ended[0].TTFT)
	})
	t.Run("ended memory is bounded", func(t *testing.T) {
		tbl, _ := newTable(t, func(c *Config) { c.Table.EndedMemory = 2 })
		for i := range 3 {
			id := fmt.Sprint(i)
			apply(tbl, start(id, t0), end(id, t0+ms, -1))
		}
		assert.Equal(t, 2, tbl.ended.len())
		assert.False(t, tbl.ended.has("0"))
		assert.True(t, tbl.ended.has("2"))
	})
}

func TestTraceVerdicts(t *testing.T) {
	tbl, rec := newTable(t, nil)
	trace := pcommon.TraceID{1, 2, 3}
	a, b := start("a", t0), start("b", t0)
	a.TraceID, b.TraceID = tokenevent.TraceID(trace), tokenevent.TraceID(trace)
	apply(tbl, a, b)
	active, kept, _ := tbl.TraceActive(trace)
	assert.True(t, active)
	assert.False(t, kept)
	// b is slow (TTFT 600 ms): the trace is kept from its first token on.
	apply(tbl, tok("b", t0+600*ms, 1))
	_, kept, _ = tbl.TraceActive(trace)
	assert.True(t, kept)
	apply(tbl, tok("a", t0+10*ms, 1), end("a", t0+20*ms, -1))
	require.Len(t, rec.ended, 1)
	assert.True(t, rec.ended[0].Keep, "a keep holds for the whole trace")
	assert.Equal(t, ReasonTrace, rec.ended[0].Reasons)
	assert.Equal(t, TraceVerdict{Done: false, Kept: true, Threshold: sampling.AlwaysSampleThreshold}, rec.ended[0].Trace)
	apply(tbl, end("b", t0+700*ms, -1))
	assert.Equal(t, TraceVerdict{Done: true, Kept: true, Threshold: sampling.AlwaysSampleThreshold}, rec.ended[1].Trace)
	active, _, _ = tbl.TraceActive(trace)
	assert.False(t, active)
}

// A session's keep at its end (an error) holds for the sessions of its
// trace still active, and is forgotten with the trace's last session: a
// later session of the trace is decided on its own (the processor's
// TraceMemory, absent here, is what remembers ended traces).
func TestEndedKeepHoldsWhileTheTraceIsActive(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Sampling.NormalPercent = 0 })
	trace := pcommon.TraceID{4, 5, 6}
	failed := end("a", t0+20*ms, -1)
	failed.Error = "boom"
	apply(tbl, inTrace(start("a", t0), trace), inTrace(start("b", t0), trace), failed)
	require.Len(t, rec.ended, 1)
	assert.Equal(t, ReasonError, rec.ended[0].Reasons)
	assert.Equal(t, TraceVerdict{Done: false, Kept: true, Threshold: sampling.AlwaysSampleThreshold}, rec.ended[0].Trace)
	active, kept, th := tbl.TraceActive(trace)
	assert.True(t, active)
	assert.True(t, kept)
	assert.Equal(t, sampling.AlwaysSampleThreshold, th)

	apply(tbl, end("b", t0+30*ms, -1))
	require.Len(t, rec.ended, 2)
	assert.True(t, rec.ended[1].Keep)
	assert.Equal(t, ReasonTrace, rec.ended[1].Reasons)
	assert.Equal(t, TraceVerdict{Done: true, Kept: true, Threshold: sampling.AlwaysSampleThreshold}, rec.ended[1].Trace)

	apply(tbl, inTrace(start("c", t0+40*ms), trace), end("c", t0+50*ms, -1))
	require.Len(t, rec.ended, 3)
	assert.False(t, rec.ended[2].Keep)
	assert.Equal(t, TraceVerdict{Done: true, Threshold: sampling.NeverSampleThreshold}, rec.ended[2].Trace)
	assert.Empty(t, tbl.traceRecords)
}

// A trace's sessions share one entry of the table's traces, however many
// (a client sending one traceparent for everything): a lookup, a start or
// an end of a session of any trace stays O(1), where an index slot per
// session would make a probe run as long as the trace's sessions. The
// trace is done at its last session's end.
func TestTraceOfManySessionsIsOneEntry(t *testing.T) {
	tbl, rec := newTable(t, nil)
	trace := pcommon.TraceID{7, 7, 7}
	const n = 50
	for i := range n {
		apply(tbl, inTrace(start(fmt.Sprint(i), t0), trace))
	}
	apply(tbl, start("other", t0))
	assert.Equal(t, 2, tbl.traces.used, "one index slot per trace")
	assert.Len(t, tbl.traceRecords, 1, "a record for the trace of many sessions only")
	for i := range n {
		apply(tbl, end(fmt.Sprint(i), t0+10*ms, -1))
		require.Len(t, rec.ended, i+1)
		assert.Equal(t, i == n-1, rec.ended[i].Trace.Done, i)
	}
	active, _, _ := tbl.TraceActive(trace)
	assert.False(t, active)
	assert.Equal(t, 1, tbl.traces.used)
	assert.Empty(t, tbl.traceRecords)
}

func TestSessionsWithoutTraceGetOne(t *testing.T) {
	tbl, _ := newTable(t, nil)
	apply(tbl, start("a", t0), start("b", t0))
	sa, sb := tbl.lookup("a"), tbl.lookup("b")
	assert.False(t, sa.TraceID.IsEmpty())
	assert.False(t, sa.SpanID.IsEmpty())
	assert.NotEqual(t, sa.TraceID, sb.TraceID)
}

// 1% of normal sessions are kept, consistently by trace ID, within binomial
// bounds; every slow session is kept.
func TestSamplingRates(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { c.Sampling.NormalPercent = 1 })
	const n = 100_000
	for i := range n {
		id := fmt.Sprint(i)
		at := t0 + int64(i)*ms
		ttft := 100 * ms
		if i%10 == 0 {
			ttft = 900 * ms // slow
		}
		apply(tbl, start(id, at), tok(id, at+ttft, 1), tok(id, at+ttft+20*ms, 1), end(id, at+ttft+20*ms, -1))
	}
	require.Len(t, rec.ended, n)
	var slowKept, normal, normalKept int
	for _, e := range rec.ended {
		if e.TTFT > 500*time.Millisecond {
			require.True(t, e.Keep)
			require.Equal(t, ReasonTTFT, e.Reasons)
			slowKept++
			continue
		}
		normal++
		if e.Keep {
			normalKept++
			assert.Equal(t, ReasonProbabilistic, e.Reasons)
			assert.Equal(t, "fd70a", e.Threshold.TValue())
		}
	}
	assert.Equal(t, n/10, slowKept)
	// Binomial(90 000, 0.01): mean 900, σ ≈ 29.8; 5σ bounds.
	mean, sigma := float64(normal)*0.01, math.Sqrt(float64(normal)*0.01*0.99)
	assert.InDelta(t, mean, float64(normalKept), 5*sigma)
}

func TestSamplingConsistentByTraceID(t *testing.T) {
	tbl, rec := newTable(t, func(c *Config) { *c = DefaultConfig() })
	th, err := sampling.ProbabilityToThresholdWithPrecision(0.01, 4)
	require.NoError(t, err)
	for i := range 2000 {
		trace := pcommon.TraceID{byte(i), byte(i >> 8), 7, 7, 7, 7, 7, 7, 7, 0x11, 0x22, 0x33, 0x44, byte(i * 7), byte(i * 13), byte(i * 31)}
		for rep := range 2 {
			id := fmt.Sprint(i, "-", rep)
			s := start(id, t0)
			s.TraceID = tokenevent.TraceID(trace)
			apply(tbl, s, tok(id, t0+10*ms, 1), tok(id, t0+20*ms, 1), end(id, t0+20*ms, -1))
		}
		a, b := rec.ended[2*i], rec.ended[2*i+1]
		require.Equal(t, a.Keep, b.Keep, "same trace ID, same verdict")
		// The verdict is the one any OTEP 235 sampler at 1% reaches.
		assert.Equal(t, th.ShouldSample(sampling.TraceIDToRandomness(trace)), a.Keep)
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := Config{Window: 0, Stall: StallConfig{Gap: -1, MaxRecords: -1}, Sampling: SamplingConfig{TTFT: -1, NormalPercent: 101}}
	err := cfg.Validate()
	require.Error(t, err)
	for _, want := range []string{
		"window: must be positive, got 0", "stall::gap: must be positive, got -1ns", "stall::consecutive: must be positive, got 0",
		"stall::max_records: must not be negative, got -1", "stall::check_interval: must be positive, got 0s",
		"table::idle_timeout: must be positive, got 0s", "table::max_active: must be positive, got 0",
		"table::ended_memory: must be positive, got 0",
		"sampling::ttft: must not be negative, got -1ns", "sampling::normal_percent: must be within [0, 100], got 101",
	} {
		assert.Contains(t, err.Error(), want)
	}
	assert.EqualError(t, ValidateWindow(maxWindow+1), "at most 4096, got 4097")
	require.NoError(t, DefaultConfig().Validate())
}

func TestReasonString(t *testing.T) {
	assert.Equal(t, "ttft,stall", (ReasonTTFT | ReasonStall).String())
	assert.Empty(t, Reason(0).String())
	assert.Equal(t, "timeout", OutcomeTimeout.String())
}

// The Observer hears of a session's first token once, at its time, also
// when the token overtook the start; a stream's later tokens are gaps.
func TestFirstTokenObserved(t *testing.T) {
	tbl, rec := newTable(t, nil)
	apply(tbl, start("a", t0), tok("a", t0+100*ms, 1), tok("a", t0+120*ms, 1), end("a", t0+130*ms, 2))
	apply(tbl, tok("b", t0+200*ms, 1), start("b", t0+150*ms), tok("b", t0+210*ms, 1))
	assert.Equal(t, []string{fmt.Sprintf("a %d", t0+100*ms), fmt.Sprintf("b %d", t0+200*ms)}, rec.firsts)
}

// A session keeps its prompt's tokens in 4 bytes: a count beyond MaxInt32,
// which no model's context holds (a sender's absurd usage), is taken as
// MaxInt32, from the start event or the end's usage, not wrapped.
func TestPromptTokensBeyondInt32(t *testing.T) {
	tbl, err := NewTable(DefaultConfig(), &recorder{})
	require.NoError(t, err)
	huge := start("a", t0)
	huge.PromptTokens = 1 << 40
	atEnd := start("b", t0)
	atEnd.PromptTokens = -1
	usage := end("b", t0+20*ms, 3)
	usage.PromptTokens = 1<<32 + 5
	var reports []Report[struct{}]
	for _, ev := range []*tokenevent.Event{huge, atEnd, end("a", t0+10*ms, 3), usage} {
		reports = tbl.Apply(ev, int64(ev.TimeUnixNano), reports)
	}
	require.Len(t, reports, 2)
	for _, r := range reports {
		assert.Equal(t, int32(math.MaxInt32), r.Session.PromptTokens, r.Session.ID)
	}
}
