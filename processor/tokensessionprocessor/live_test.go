// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

func loadLiveConfig(t *testing.T, name string) (*Config, error) {
	t.Helper()
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "live.yaml"))
	require.NoError(t, err)
	sub, err := cm.Sub(component.NewIDWithName(metadata.Type, name).String())
	require.NoError(t, err)
	cfg := createDefaultConfig()
	if err := sub.Unmarshal(cfg); err != nil {
		return nil, err
	}
	return cfg, confmap.Validate(cfg)
}

func TestLiveConfig(t *testing.T) {
	def := createDefaultConfig().Live
	assert.False(t, def.Enabled(), "off by default")
	assert.Equal(t, time.Second, def.Interval)
	assert.Equal(t, 500, def.MaxSessions)
	assert.Equal(t, 100, def.Recent)
	assert.Equal(t, 16, def.MaxViewers)
	assert.Equal(t, 16, def.MaxFilters)
	assert.Equal(t, 64, def.MaxEngines)

	cfg, err := loadLiveConfig(t, "live")
	require.NoError(t, err)
	l := cfg.Live
	assert.True(t, l.Enabled())
	assert.Equal(t, "127.0.0.1:0", l.ServerConfig.NetAddr.Endpoint)
	assert.Equal(t, 5*time.Second, l.ServerConfig.ReadHeaderTimeout, "confighttp's own settings sit beside the view's")
	assert.Equal(t, 250*time.Millisecond, l.Interval)
	assert.Equal(t, 50, l.MaxSessions)
	assert.Equal(t, 20, l.Recent)
	assert.Equal(t, 4, l.MaxViewers)
	assert.Equal(t, 3, l.MaxFilters)
	assert.Equal(t, 8, l.MaxEngines)
	assert.Equal(t, "https://tempo.example/trace/{trace_id}", l.TraceURL)
	assert.Equal(t, []string{"tenant"}, l.Attributes)

	_, err = loadLiveConfig(t, "live_invalid")
	require.Error(t, err)
	for _, want := range []string{
		"live::interval: must be at least 50ms, got 10ms",
		"live::max_sessions: want 1 to 10000, got 0",
		"live::recent: want 0 to 10000, got -1",
		"live::max_viewers: want 1 to 1000, got 0",
		"live::max_filters: want 1 to 64, got 65",
		"live::max_engines: want 1 to 1000, got 0",
		`live::trace_url: want an http or https URL, got "javascript:alert(1)//{trace_id}"`,
		"live::attributes[0]: must not be empty",
	} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = loadLiveConfig(t, "live_no_placeholder")
	require.ErrorContains(t, err, `live::trace_url: want {trace_id} in "https://tempo.example/trace/", where the trace ID goes`)
}

// liveCore is a token_session core with the live view on, not started:
// the test drives its clock through fold and tick.
func liveCore(t *testing.T, mutate func(*live.Config)) *core {
	t.Helper()
	return liveCoreWith(t, nil, mutate)
}

// liveCoreWith is liveCore with its self-telemetry recorded in tel.
func liveCoreWith(t *testing.T, tel *componenttest.Telemetry, mutate func(*live.Config)) *core {
	t.Helper()
	cfg := createDefaultConfig()
	cfg.Live.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	if mutate != nil {
		mutate(&cfg.Live)
	}
	require.NoError(t, cfg.Validate())
	set := processortest.NewNopSettings(metadata.Type)
	if tel != nil {
		set.TelemetrySettings = tel.NewTelemetrySettings()
	}
	c, err := newCore(cfg, set)
	require.NoError(t, err)
	t.Cleanup(c.telemetry.shutdown)
	return c
}

// feed folds each event as a batch of its own, arriving (collector time)
// at its own engine time, in time order: engine and collector clocks agree.
func feed(t *testing.T, c *core, evs ...tokenevent.Event) {
	t.Helper()
	slices.SortStableFunc(evs, func(a, b tokenevent.Event) int { return int(int64(a.TimeUnixNano) - int64(b.TimeUnixNano)) })
	for _, ev := range evs {
		_, invalid, err := c.sessions.fold(events(ev), time.Unix(0, int64(ev.TimeUnixNano)))
		require.Zero(t, invalid, err)
	}
}

// liveScenario is one session in each phase, and one ended, on vllm-0:
// at t0+2 s "frozen" has been silent 1.86 s while the engine's clock moved
// on (decoding's tokens), "stalled" had three 300 ms gaps, "waiting" has
// waited 1.5 s for its first token, "decoding" streams every 20 ms.
func liveScenario(t *testing.T, c *core, t0 int64) time.Time {
	t.Helper()
	withAttrs := func(ev tokenevent.Event) tokenevent.Event {
		ev.Attributes = []tokenevent.Attribute{{Key: "tenant", Value: "acme"}, {Key: "user.email", Value: "someone@example.com"}}
		return ev
	}
	evs := []tokenevent.Event{
		withAttrs(start("frozen", traceSlow, t0)), tok("frozen", t0+100*ms, 1), tok("frozen", t0+120*ms, 1), tok("frozen", t0+140*ms, 1),
		start("stalled", traceFast, t0), tok("stalled", t0+100*ms, 1), tok("stalled", t0+400*ms, 1), tok("stalled", t0+700*ms, 1), tok("stalled", t0+1000*ms, 1),
		start("waiting", traceFast, t0+500*ms),
		start("ended", traceFast, t0), tok("ended", t0+50*ms, 1), tok("ended", t0+60*ms, 1), end("ended", t0+70*ms),
		start("decoding", traceFast, t0),
	}
	for at := t0 + 100*ms; at <= t0+2000*ms; at += 20 * ms {
		evs = append(evs, tok("decoding", at, 1))
	}
	feed(t, c, evs...)
	now := time.Unix(0, t0+2000*ms)
	c.sessions.tick(now)
	return now
}

func takeLive(t *testing.T, c *core, now time.Time, f live.Filter) live.Snapshot {
	t.Helper()
	var snap live.Snapshot
	require.NoError(t, json.Unmarshal(c.view.Snapshot(now, f), &snap))
	return snap
}

func phasesOf(snap live.Snapshot) []string {
	var out []string
	for _, s := range snap.Sessions {
		out = append(out, s.ID+"="+s.Phase)
	}
	return out
}

func TestLiveSnapshotWorstFirst(t *testing.T) {
	c := liveCore(t, func(l *live.Config) { l.Attributes = []string{"tenant"} })
	t0 := base
	now := liveScenario(t, c, t0)
	snap := takeLive(t, c, now, live.Filter{})

	assert.Equal(t, 4, snap.InFlight)
	assert.Equal(t, 4, snap.Matching)
	assert.Equal(t, []string{"frozen=frozen", "stalled=stalled", "waiting=waiting", "decoding=decoding"}, phasesOf(snap))

	frozen := snap.Sessions[0]
	assert.Equal(t, "llama", frozen.Model)
	assert.Equal(t, "vllm-0", frozen.Engine)
	assert.Equal(t, "chat", frozen.Operation)
	assert.Equal(t, int64(3), frozen.Tokens)
	assert.InDelta(t, 1860, frozen.GapMs, 0.001, "since its last token, on the engine's clock")
	assert.InDelta(t, 2000, frozen.AgeMs, 0.001)
	require.NotNil(t, frozen.TTFTMs)
	assert.InDelta(t, 100, *frozen.TTFTMs, 0.001)
	assert.Nil(t, frozen.WaitingMs)
	assert.Zero(t, frozen.TokensPerSec, "a frozen stream makes no tokens")
	assert.InDelta(t, 20, frozen.MaxGapMs, 0.001)
	assert.Equal(t, int32(1), frozen.Stalls)
	assert.True(t, frozen.Sampled)
	assert.Equal(t, "freeze", frozen.KeepReason)
	assert.Equal(t, traceSlow.String(), frozen.TraceID)
	assert.Equal(t, map[string]string{"tenant": "acme"}, frozen.Attributes, "only the attributes live::attributes names")

	stalled := snap.Sessions[1]
	assert.Equal(t, "stall", stalled.KeepReason)
	assert.InDelta(t, 300, stalled.MaxGapMs, 0.001)

	waiting := snap.Sessions[2]
	assert.Nil(t, waiting.TTFTMs)
	require.NotNil(t, waiting.WaitingMs)
	assert.InDelta(t, 1500, *waiting.WaitingMs, 0.001)
	assert.False(t, waiting.Sampled)

	decoding := snap.Sessions[3]
	assert.InDelta(t, 50, decoding.TokensPerSec, 0.001, "a token every 20 ms")
	assert.Zero(t, decoding.GapMs)

	require.Len(t, snap.Engines, 1)
	e := snap.Engines[0]
	assert.Equal(t, live.EngineJSON{
		Engine: "vllm-0", InFlight: 4, Waiting: 1, Decoding: 1, Stalled: 1, Frozen: 1,
		TokensPerSec: e.TokensPerSec, MaxWaitingMs: 1500, TTFTP50Ms: e.TTFTP50Ms, TTFTP99Ms: e.TTFTP99Ms, TTFTCount: 4,
	}, e)
	// stalled's window: gaps of 300 ms, 3.3 tokens/s; decoding's 50.
	assert.InDelta(t, 53.3, e.TokensPerSec, 0.05)
	// TTFTs 50 (ended), 100, 100, 100 ms; a bucket is 19% wide.
	require.NotNil(t, e.TTFTP50Ms)
	assert.InDelta(t, 100, *e.TTFTP50Ms, 19)
	assert.InDelta(t, 100, *e.TTFTP99Ms, 19)

	require.Len(t, snap.Recent, 1)
	r := snap.Recent[0]
	assert.Equal(t, "ended", r.ID)
	assert.Equal(t, "completed", r.Outcome)
	require.NotNil(t, r.TTFTMs)
	assert.InDelta(t, 50, *r.TTFTMs, 0.001)
	require.NotNil(t, r.TPOTMs)
	assert.InDelta(t, 10, *r.TPOTMs, 0.001)
	assert.Equal(t, int64(2), r.Tokens)
	assert.False(t, r.Sampled)
	assert.Equal(t, time.Unix(0, t0+70*ms).UTC(), r.Ended)
}

func TestLiveSnapshotBoundedAndFiltered(t *testing.T) {
	c := liveCore(t, func(l *live.Config) { l.MaxSessions = 2 })
	now := liveScenario(t, c, base)

	snap := takeLive(t, c, now, live.Filter{})
	assert.Equal(t, []string{"frozen=frozen", "stalled=stalled"}, phasesOf(snap), "the worst max_sessions")
	assert.Equal(t, 4, snap.Matching)
	assert.Equal(t, 4, snap.Engines[0].InFlight, "the totals count every session")

	snap = takeLive(t, c, now, live.Filter{Engine: "vllm-1"})
	assert.Empty(t, snap.Sessions)
	assert.Empty(t, snap.Recent)
	assert.Zero(t, snap.Matching)
	assert.Equal(t, 4, snap.InFlight)
	assert.Empty(t, snap.Engines, "the engines are filtered as the sessions are")

	snap = takeLive(t, c, now, live.Filter{Engine: "vllm-0", Model: "llama"})
	assert.Len(t, snap.Sessions, 2)
	assert.Len(t, snap.Recent, 1)
}

// The ring of ended sessions keeps the latest live::recent, latest first.
func TestLiveRecentRing(t *testing.T) {
	c := liveCore(t, func(l *live.Config) { l.Recent = 3 })
	var evs []tokenevent.Event
	for i := range 5 {
		id := fmt.Sprintf("s%d", i)
		at := base + int64(i)*100*ms
		evs = append(evs, start(id, traceFast, at), tok(id, at+10*ms, 1), end(id, at+20*ms))
	}
	feed(t, c, evs...)
	snap := takeLive(t, c, time.Unix(0, base+time.Second.Nanoseconds()), live.Filter{})
	var ids []string
	for _, r := range snap.Recent {
		ids = append(ids, r.ID)
	}
	assert.Equal(t, []string{"s4", "s3", "s2"}, ids)
	assert.Empty(t, snap.Sessions)
	require.Len(t, snap.Engines, 1, "an engine with TTFTs in the last minute has its bar")
	assert.Equal(t, uint64(5), snap.Engines[0].TTFTCount)

	// A minute on, its TTFTs are forgotten, and so is the engine.
	snap = takeLive(t, c, time.Unix(0, base+2*time.Minute.Nanoseconds()), live.Filter{})
	assert.Empty(t, snap.Engines)
	assert.Len(t, snap.Recent, 3, "the ended sessions stay listed")
}

// counterSum is the sum of the counter name's points in tel (0 when it has
// none).
func counterSum(t *testing.T, tel *componenttest.Telemetry, name string) int64 {
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

// startOn is start on engine with model.
func startOn(id, engine, model string, at int64) tokenevent.Event {
	ev := start(id, traceFast, at)
	ev.Engine, ev.Model = engine, model
	return ev
}

func enginesOf(snap live.Snapshot) map[string]live.EngineJSON {
	out := make(map[string]live.EngineJSON)
	for _, e := range snap.Engines {
		out[e.Engine] = e
	}
	return out
}

// The engines are filtered as the sessions are: an engine is listed when
// the filter picks some of its sessions (in flight, or ended with a TTFT
// in the last minute), and its figures count only those.
func TestLiveEnginesFilteredLikeSessions(t *testing.T) {
	c := liveCore(t, nil)
	feed(t, c,
		startOn("a", "vllm-0", "llama", base), tok("a", base+100*ms, 1),
		startOn("b", "vllm-0", "mistral", base), tok("b", base+200*ms, 1),
		startOn("c", "vllm-1", "mistral", base),
		startOn("d", "vllm-1", "mistral", base), tok("d", base+300*ms, 1), end("d", base+400*ms),
		startOn("e", "vllm-2", "llama", base),
	)
	now := time.Unix(0, base+time.Second.Nanoseconds())

	all := enginesOf(takeLive(t, c, now, live.Filter{}))
	require.Len(t, all, 3)
	assert.Equal(t, 2, all["vllm-0"].InFlight)
	assert.Equal(t, uint64(2), all["vllm-0"].TTFTCount)
	assert.Equal(t, 1, all["vllm-1"].InFlight)
	assert.Equal(t, uint64(1), all["vllm-1"].TTFTCount, "d's, ended")

	snap := takeLive(t, c, now, live.Filter{Model: "mistral"})
	mistral := enginesOf(snap)
	require.Len(t, mistral, 2, "vllm-2 has no mistral session")
	assert.Equal(t, live.EngineJSON{
		Engine: "vllm-0", InFlight: 1, Decoding: 1, TokensPerSec: 0, TTFTP50Ms: mistral["vllm-0"].TTFTP50Ms,
		TTFTP99Ms: mistral["vllm-0"].TTFTP99Ms, TTFTCount: 1,
	}, mistral["vllm-0"], "b only, not llama's a")
	assert.InDelta(t, 200, *mistral["vllm-0"].TTFTP50Ms, 200*0.19)
	assert.Equal(t, 1, mistral["vllm-1"].Waiting)
	assert.Equal(t, uint64(1), mistral["vllm-1"].TTFTCount)
	assert.Equal(t, []string{"d"}, []string{snap.Recent[0].ID})

	snap = takeLive(t, c, now, live.Filter{Model: "llama"})
	assert.Equal(t, []string{"vllm-0", "vllm-2"}, slices.Sorted(maps.Keys(enginesOf(snap))))
	assert.Empty(t, snap.Recent)
	assert.Equal(t, 1, enginesOf(snap)["vllm-0"].InFlight)

	snap = takeLive(t, c, now, live.Filter{Engine: "vllm-1"})
	assert.Equal(t, []string{"vllm-1"}, slices.Sorted(maps.Keys(enginesOf(snap))))
	snap = takeLive(t, c, now, live.Filter{Engine: "vllm-0", Model: "llama"})
	require.Len(t, snap.Engines, 1)
	assert.Equal(t, 1, snap.Engines[0].InFlight)
	assert.Zero(t, snap.EnginesLeftOut)
}

// Past live::max_engines, the worst engines are listed (the most frozen,
// then stalled, then in flight), by name, and the rest are counted.
func TestLiveEnginesWorstListed(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	c := liveCoreWith(t, tel, func(l *live.Config) { l.MaxEngines = 2 })
	var evs []tokenevent.Event
	for e := 1; e <= 5; e++ {
		for i := range e {
			evs = append(evs, startOn(fmt.Sprintf("e%d-%d", e, i), fmt.Sprintf("e%d", e), "llama", base+100*ms))
		}
	}
	feed(t, c, evs...)
	now := liveScenario(t, c, base) // vllm-0: four in flight, one frozen

	snap := takeLive(t, c, now, live.Filter{})
	var names []string
	for _, e := range snap.Engines {
		names = append(names, e.Engine)
	}
	assert.Equal(t, []string{"e5", "vllm-0"}, names, "vllm-0 for its frozen session, e5 for its five in flight")
	assert.Equal(t, 4, snap.EnginesLeftOut)
	assert.Equal(t, int64(4), counterSum(t, tel, "otelcol_processor_token_session_live_engines_left_out"))
	assert.Equal(t, 4+15, snap.InFlight, "every session counted")

	snap = takeLive(t, c, now, live.Filter{Engine: "e1"})
	assert.Zero(t, snap.EnginesLeftOut)
	assert.Len(t, snap.Engines, 1)
}
