// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/heldspans"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// shareClock is the collector's clock of these tests: the sessions part
// takes its time from its caller, so the waits are stepped, never slept.
// Its start is the engine times' base: the events are on time.
var shareClock = time.Unix(0, base)

// shareParts is the sessions part alone, in a logs, metrics and traces
// pipeline, with its self-telemetry.
type shareParts struct {
	*sessions
	tel *componenttest.Telemetry
}

func newShareParts(t *testing.T, mutate func(*Config)) *shareParts {
	t.Helper()
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	cfg := createDefaultConfig()
	cfg.Sampling.NormalPercent = 100
	cfg.Traces.PhaseSpans = false
	// Each fold brings its events whole: the steps settle at its end.
	cfg.Attribution.SettleAfter, cfg.Attribution.StepJoin = 0, 0
	if mutate != nil {
		mutate(cfg)
	}
	require.NoError(t, cfg.Validate())
	telemetry, err := newProcessorTelemetry(set)
	require.NoError(t, err)
	t.Cleanup(telemetry.shutdown)
	buf, err := heldspans.New(cfg.Traces)
	require.NoError(t, err)
	p, err := newSessions(cfg, telemetry, &engineContext{states: engineStates{maxInstances: cfg.Metrics.MaxEngines}}, &spanGate{buf: buf})
	require.NoError(t, err)
	p.toLogs, p.toMetrics, p.toTraces = true, true, true
	return &shareParts{sessions: p, tel: tel}
}

// shareTenant is the tenant of the share tests' sessions.
const shareTenant = "acme"

// engineSession is a session of shareTenant whose start names its engine request
// id, "<id>-0a1b2c3d" (as vLLM's internal id is the external one and a
// suffix): prefill 100 ms, decode 200 ms, alone on its engine, so the
// collector's estimate is 0.1 s and 0.2 s.
func engineSession(id string, at int64) []tokenevent.Event {
	st := start(id, pcommon.TraceID{0x5a, byte(len(id)), id[0]}, at)
	st.Attributes = []tokenevent.Attribute{{Key: "tenant.id", Value: shareTenant}, {Key: tokenevent.AttrEngineRequestID, Value: id + "-0a1b2c3d"}}
	return []tokenevent.Event{st, tok(id, at+100*ms, 1), tok(id, at+200*ms, 1), tok(id, at+300*ms, 1), end(id, at+300*ms)}
}

// shareOf is the engine core's share of the request of the session id.
func shareOf(id string, at, prefillNs, decodeNs int64) tokenevent.Event {
	return tokenevent.Event{
		Kind: tokenevent.KindShare, EngineRequestID: id + "-0a1b2c3d", TimeUnixNano: uint64(at), Engine: "vllm-0",
		EngineTimePrefillNs: prefillNs, EngineTimeDecodeNs: decodeNs, HasEngineTime: true, PromptTokens: -1, Count: 1, CompletionTokens: -1,
	}
}

// The engine's share in ns: not the collector's estimate (0.1 s, 0.2 s).
const sharePrefillNs, shareDecodeNs = 41_000_123, 96_500_456

func (p *shareParts) fold(t *testing.T, at time.Time, evs ...tokenevent.Event) outputs {
	t.Helper()
	out, invalid, err := p.sessions.fold(events(evs...), at)
	require.NoError(t, err)
	require.Zero(t, invalid)
	return out
}

// spanShare is the share on the session span of id in out, and whether the
// span is there.
func spanShare(t *testing.T, out outputs, id string) (map[string]any, bool) {
	t.Helper()
	for _, s := range allSpans([]ptrace.Traces{out.traces}) {
		if v, ok := s.Attributes().Get("llm.session.id"); ok && v.Str() == id {
			a := s.Attributes().AsRaw()
			return map[string]any{
				"source": a[attrAttributionSource], "prefill": a[attrEngineTimePrefill], "decode": a[attrEngineTimeDecode],
			}, true
		}
	}
	return nil, false
}

// counted is the llm.engine.time the counters hold for shareTenant, prefill and
// decode, at collector time at.
func (p *shareParts) counted(at time.Time) [2]float64 {
	var got [2]float64
	md := p.sessionMetrics(at)
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				if m.Name() != "llm.engine.time" || m.Type() != pmetric.MetricTypeSum {
					continue
				}
				for _, dp := range m.Sum().DataPoints().All() {
					tn, _ := dp.Attributes().Get("llm.tenant")
					state, _ := dp.Attributes().Get("state")
					if tn.Str() != shareTenant {
						continue
					}
					switch state.Str() {
					case "prefill":
						got[0] += dp.DoubleValue()
					case "decode":
						got[1] += dp.DoubleValue()
					}
				}
			}
		}
	}
	return got
}

// shareResults counts engine_shares by result.
func (p *shareParts) shareResults(t *testing.T) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	m, err := p.tel.GetMetric("otelcol_processor_token_session_engine_shares")
	if err != nil {
		return got
	}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		r, _ := dp.Attributes.Value("result")
		got[r.AsString()] += dp.Value
	}
	return got
}

var exactShare = map[string]any{
	"source": "engine", "prefill": float64(sharePrefillNs) / 1e9, "decode": float64(shareDecodeNs) / 1e9,
}

// The share comes 1 s after the session ended (the engine core's client
// batches on its own): the kept session's span and summary wait for it and
// carry the engine's exact share, and the counters count it, not the
// collector's estimate, which they had not counted before.
func TestShareAfterTheEnd(t *testing.T) {
	p := newShareParts(t, nil)
	out := p.fold(t, shareClock, engineSession("chat-1", base)...)
	_, emitted := spanShare(t, out, "chat-1")
	assert.False(t, emitted, "held for the engine's share")
	assert.Empty(t, recordsNamed([]plog.Logs{out.logs}, eventNameSummary), "the summary waits too")
	assert.Equal(t, [2]float64{0, 0}, p.counted(shareClock.Add(500*time.Millisecond)), "not counted before its share")

	out = p.fold(t, shareClock.Add(time.Second), shareOf("chat-1", base+time.Second.Nanoseconds(), sharePrefillNs, shareDecodeNs))
	got, emitted := spanShare(t, out, "chat-1")
	require.True(t, emitted, "released by its share")
	assert.Equal(t, exactShare, got)
	summaries := recordsNamed([]plog.Logs{out.logs}, eventNameSummary)
	require.Len(t, summaries, 1)
	assert.Equal(t, "engine", summaries[0].Attributes().AsRaw()[attrAttributionSource])
	assert.Equal(t, float64(sharePrefillNs)/1e9+float64(shareDecodeNs)/1e9, summaries[0].Attributes().AsRaw()[attrEngineTime])
	assert.Equal(t, [2]float64{float64(sharePrefillNs) / 1e9, float64(shareDecodeNs) / 1e9}, p.counted(shareClock.Add(2*time.Second)))
	assert.Equal(t, map[string]int64{"joined": 1}, p.shareResults(t))
}

// The share comes first (the engine core frees the request before the API
// server sends its end): it waits, and the session takes it at its end,
// with nothing held.
func TestShareBeforeTheEnd(t *testing.T) {
	p := newShareParts(t, nil)
	evs := engineSession("chat-2", base)
	out := p.fold(t, shareClock, append(evs[:3:3], shareOf("chat-2", base+250*ms, sharePrefillNs, shareDecodeNs))...)
	_, emitted := spanShare(t, out, "chat-2")
	assert.False(t, emitted, "not ended yet")

	out = p.fold(t, shareClock.Add(100*time.Millisecond), evs[3:]...)
	got, emitted := spanShare(t, out, "chat-2")
	require.True(t, emitted, "out at its end")
	assert.Equal(t, exactShare, got)
	assert.Equal(t, [2]float64{float64(sharePrefillNs) / 1e9, float64(shareDecodeNs) / 1e9}, p.counted(shareClock.Add(time.Second)))
	assert.Equal(t, map[string]int64{"joined": 1}, p.shareResults(t))
}

// A session not kept has no outputs to hold, but its counting waits for the
// share all the same.
func TestShareCountedForASessionNotKept(t *testing.T) {
	p := newShareParts(t, func(c *Config) { c.Sampling.NormalPercent = 0 })
	out := p.fold(t, shareClock, engineSession("chat-3", base)...)
	_, emitted := spanShare(t, out, "chat-3")
	assert.False(t, emitted, "not kept")
	p.fold(t, shareClock.Add(2*time.Second), shareOf("chat-3", base+2*time.Second.Nanoseconds(), sharePrefillNs, shareDecodeNs))
	assert.Equal(t, [2]float64{float64(sharePrefillNs) / 1e9, float64(shareDecodeNs) / 1e9}, p.counted(shareClock.Add(3*time.Second)))
}

// No share comes: at the end of attribution::share_wait the outputs go with
// the collector's estimate, which the counters then count; a share after
// that is an orphan, and changes nothing.
func TestShareNeverComes(t *testing.T) {
	p := newShareParts(t, func(c *Config) { c.Attribution.ShareWait = 5 * time.Second })
	p.fold(t, shareClock, engineSession("chat-4", base)...)
	out, _ := p.tick(shareClock.Add(5*time.Second - 1))
	_, emitted := spanShare(t, out, "chat-4")
	assert.False(t, emitted, "still within the wait")

	out, _ = p.tick(shareClock.Add(5 * time.Second))
	got, emitted := spanShare(t, out, "chat-4")
	require.True(t, emitted, "released at the end of the wait")
	assert.Equal(t, "collector", got["source"])
	assert.InDelta(t, 0.1, got["prefill"], 1e-9, "the estimate: prefilling alone")
	assert.InDelta(t, 0.2, got["decode"], 1e-9)
	estimate := p.counted(shareClock.Add(6 * time.Second))
	assert.InDelta(t, 0.1, estimate[0], 1e-9)
	assert.InDelta(t, 0.2, estimate[1], 1e-9)

	p.fold(t, shareClock.Add(7*time.Second), shareOf("chat-4", base+7*time.Second.Nanoseconds(), sharePrefillNs, shareDecodeNs))
	out, _ = p.tick(shareClock.Add(12 * time.Second))
	_, emitted = spanShare(t, out, "chat-4")
	assert.False(t, emitted, "out once")
	assert.Equal(t, estimate, p.counted(shareClock.Add(13*time.Second)), "counted once")
	assert.Equal(t, map[string]int64{"expired": 1, "orphaned": 1}, p.shareResults(t))
}

// A share that names a request no session named waits, then is dropped and
// counted; a session whose start named no id waits for nothing.
func TestShareForAnUnknownRequest(t *testing.T) {
	p := newShareParts(t, nil)
	out := p.fold(t, shareClock, append(fastSession("plain"), shareOf("nobody", base, 1, 2))...)
	_, emitted := spanShare(t, out, "plain")
	assert.True(t, emitted, "a session that named no engine request id does not wait")
	p.tick(shareClock.Add(5 * time.Second))
	assert.Equal(t, map[string]int64{"orphaned": 1}, p.shareResults(t))
	assert.Zero(t, p.shares.pending(), "nothing held")
}

// attribution::max_pending_shares bounds what waits, sessions and shares
// together: beyond it a share is dropped and a session takes the
// collector's estimate at once; both are counted.
func TestShareOverflow(t *testing.T) {
	p := newShareParts(t, func(c *Config) { c.Attribution.MaxPendingShares = 1 })
	out := p.fold(t, shareClock, engineSession("first", base)...)
	_, emitted := spanShare(t, out, "first")
	assert.False(t, emitted, "waits: room for one")
	p.fold(t, shareClock, shareOf("stranger", base, 1, 2))
	out = p.fold(t, shareClock, engineSession("second", base)...)
	got, emitted := spanShare(t, out, "second")
	require.True(t, emitted, "no room to wait: out at once")
	assert.Equal(t, "collector", got["source"])
	assert.Equal(t, map[string]int64{"overflow": 2}, p.shareResults(t))

	out = p.fold(t, shareClock.Add(time.Second), shareOf("first", base, sharePrefillNs, shareDecodeNs))
	got, emitted = spanShare(t, out, "first")
	require.True(t, emitted)
	assert.Equal(t, exactShare, got, "the one that waited is joined")
}

// At shutdown a session still waiting goes out with the collector's
// estimate, counted before the last metrics.
func TestShareWaitEndsAtShutdown(t *testing.T) {
	p := newShareParts(t, nil)
	p.fold(t, shareClock, engineSession("last", base)...)
	out, md := p.shutdown(shareClock.Add(time.Second))
	got, emitted := spanShare(t, out, "last")
	require.True(t, emitted)
	assert.Equal(t, "collector", got["source"])
	assert.Positive(t, md.MetricCount())
	assert.Equal(t, map[string]int64{"expired": 1}, p.shareResults(t))
}

// Every ended session waits for its engine's steps to settle; beyond four
// times attribution::max_pending_shares waiting so, a session is counted
// at once with its share so far, and counted as an overflow.
func TestSettlingOverflow(t *testing.T) {
	p := newShareParts(t, func(c *Config) {
		c.Attribution.MaxPendingShares = 1
		c.Attribution.SettleAfter = time.Hour
	})
	var evs []tokenevent.Event
	for i := range 6 {
		id := fmt.Sprintf("s-%d", i)
		evs = append(evs, start(id, pcommon.TraceID{0x5b, byte(i + 1)}, base), tok(id, base+10*ms, 1), end(id, base+10*ms))
	}
	p.fold(t, shareClock, evs...)
	assert.Equal(t, map[string]int64{"overflow": 2}, p.shareResults(t), "4 wait, 2 do not")
	assert.Len(t, p.shares.settling, 4)
}
