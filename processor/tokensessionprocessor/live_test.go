package tokensessionprocessor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/internal/exphist"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
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
	assert.False(t, def.enabled(), "off by default")
	assert.Equal(t, time.Second, def.Interval)
	assert.Equal(t, 500, def.MaxSessions)
	assert.Equal(t, 100, def.Recent)
	assert.Equal(t, 16, def.MaxViewers)
	assert.Equal(t, 16, def.MaxFilters)
	assert.Equal(t, 64, def.MaxEngines)

	cfg, err := loadLiveConfig(t, "live")
	require.NoError(t, err)
	l := cfg.Live
	assert.True(t, l.enabled())
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
func liveCore(t *testing.T, mutate func(*LiveConfig)) *core {
	t.Helper()
	return liveCoreWith(t, nil, mutate)
}

// liveCoreWith is liveCore with its self-telemetry recorded in tel.
func liveCoreWith(t *testing.T, tel *componenttest.Telemetry, mutate func(*LiveConfig)) *core {
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

func takeLive(t *testing.T, c *core, now time.Time, f liveFilter) liveSnapshot {
	t.Helper()
	var snap liveSnapshot
	require.NoError(t, json.Unmarshal(c.view.snapshot(now, f, &liveScan{}), &snap))
	return snap
}

func phasesOf(snap liveSnapshot) []string {
	var out []string
	for _, s := range snap.Sessions {
		out = append(out, s.ID+"="+s.Phase)
	}
	return out
}

func TestLiveSnapshotWorstFirst(t *testing.T) {
	c := liveCore(t, func(l *LiveConfig) { l.Attributes = []string{"tenant"} })
	t0 := base
	now := liveScenario(t, c, t0)
	snap := takeLive(t, c, now, liveFilter{})

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
	assert.Equal(t, liveEngineJSON{
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
	c := liveCore(t, func(l *LiveConfig) { l.MaxSessions = 2 })
	now := liveScenario(t, c, base)

	snap := takeLive(t, c, now, liveFilter{})
	assert.Equal(t, []string{"frozen=frozen", "stalled=stalled"}, phasesOf(snap), "the worst max_sessions")
	assert.Equal(t, 4, snap.Matching)
	assert.Equal(t, 4, snap.Engines[0].InFlight, "the totals count every session")

	snap = takeLive(t, c, now, liveFilter{engine: "vllm-1"})
	assert.Empty(t, snap.Sessions)
	assert.Empty(t, snap.Recent)
	assert.Zero(t, snap.Matching)
	assert.Equal(t, 4, snap.InFlight)
	assert.Empty(t, snap.Engines, "the engines are filtered as the sessions are")

	snap = takeLive(t, c, now, liveFilter{engine: "vllm-0", model: "llama"})
	assert.Len(t, snap.Sessions, 2)
	assert.Len(t, snap.Recent, 1)
}

// The ring of ended sessions keeps the latest live::recent, latest first.
func TestLiveRecentRing(t *testing.T) {
	c := liveCore(t, func(l *LiveConfig) { l.Recent = 3 })
	var evs []tokenevent.Event
	for i := range 5 {
		id := fmt.Sprintf("s%d", i)
		at := base + int64(i)*100*ms
		evs = append(evs, start(id, traceFast, at), tok(id, at+10*ms, 1), end(id, at+20*ms))
	}
	feed(t, c, evs...)
	snap := takeLive(t, c, time.Unix(0, base+time.Second.Nanoseconds()), liveFilter{})
	var ids []string
	for _, r := range snap.Recent {
		ids = append(ids, r.ID)
	}
	assert.Equal(t, []string{"s4", "s3", "s2"}, ids)
	assert.Empty(t, snap.Sessions)
	require.Len(t, snap.Engines, 1, "an engine with TTFTs in the last minute has its bar")
	assert.Equal(t, uint64(5), snap.Engines[0].TTFTCount)

	// A minute on, its TTFTs are forgotten, and so is the engine.
	snap = takeLive(t, c, time.Unix(0, base+2*time.Minute.Nanoseconds()), liveFilter{})
	assert.Empty(t, snap.Engines)
	assert.Len(t, snap.Recent, 3, "the ended sessions stay listed")
}

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

// The endpoint, as a browser or curl sees it.

// liveServerOf starts token_session in all three pipelines with the live
// view on 127.0.0.1:0, and returns its base URL.
func liveServerOf(t *testing.T, p *pipelines) string {
	t.Helper()
	c := p.logs.(*logsProcessor).Unwrap()
	require.NotNil(t, c.live)
	return "http://" + c.live.http.Addr.String()
}

func livePipelines(t *testing.T, set *componenttest.Telemetry, mutate func(*LiveConfig)) (*pipelines, string) {
	t.Helper()
	s := processortest.NewNopSettings(metadata.Type)
	if set != nil {
		s.TelemetrySettings = set.NewTelemetrySettings()
	}
	p := newPipelinesWith(t, s, func(cfg *Config) {
		cfg.Live.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
		cfg.Live.Interval = 50 * time.Millisecond
		if mutate != nil {
			mutate(&cfg.Live)
		}
	})
	return p, liveServerOf(t, p)
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url) //nolint:gosec // the test's own server
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

func TestLiveEndpoints(t *testing.T) {
	p, url := livePipelines(t, nil, func(l *LiveConfig) { l.TraceURL = "https://tempo.example/trace/{trace_id}" })
	defer p.shutdown(t)
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(start("s1", traceSlow, base), tok("s1", base+10*ms, 1))))

	resp, body := get(t, url+"/")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
	assert.Contains(t, string(body), `new EventSource("sessions/stream"`)
	assert.NotContains(t, string(body), "http://", "no script or style from elsewhere")
	assert.NotContains(t, string(body), "https://")

	resp, body = get(t, url+"/sessions")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var snap liveSnapshot
	require.NoError(t, json.Unmarshal(body, &snap))
	assert.Equal(t, []string{"s1=decoding"}, phasesOf(snap))
	assert.Equal(t, "https://tempo.example/trace/{trace_id}", snap.TraceURL)

	resp, body = get(t, url+"/sessions?engine=other")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.Unmarshal(body, &snap))
	assert.Empty(t, snap.Sessions)

	resp, body = get(t, url+"/nope")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.JSONEq(t, `{"error":"no such endpoint: GET /, /sessions or /sessions/stream"}`, string(body))

	post, err := http.Post(url+"/sessions", "application/json", strings.NewReader("{}")) //nolint:gosec // the test's own server
	require.NoError(t, err)
	post.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, post.StatusCode)
}

// GET /sessions answers from a recent snapshot where it has one, and
// takes at most onDemandRate new ones a second however they are asked for
// (a filter each, to defeat the sharing): each holds the sessions' lock.
func TestLiveAskedSnapshotsSharedAndLimited(t *testing.T) {
	p, url := livePipelines(t, nil, func(l *LiveConfig) { l.Interval = time.Minute })
	defer p.shutdown(t)
	ls := p.logs.(*logsProcessor).Unwrap().live
	clock := time.Now()
	setClock := func(at time.Time) {
		// The server reads its clock under these locks (no broadcaster
		// runs: no viewer).
		ls.mu.Lock()
		ls.askMu.Lock()
		clock = at
		ls.now = func() time.Time { return clock }
		ls.askMu.Unlock()
		ls.mu.Unlock()
	}
	setClock(clock)

	first := map[string][]byte{}
	for i := range onDemandRate {
		engine := fmt.Sprintf("e%d", i)
		resp, body := get(t, url+"/sessions?engine="+engine)
		require.Equal(t, http.StatusOK, resp.StatusCode, engine)
		first[engine] = body
	}
	resp, body := get(t, url+"/sessions?engine=one-too-many")
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Contains(t, string(body), "at most 10 a second")

	// A session that starts now is not in the snapshot shared for the
	// interval; the filters asked for are answered, spent rate or not.
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(start("s1", traceSlow, base))))
	resp, body = get(t, url+"/sessions?engine=e0")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, first["e0"], body)

	// A second later the rate allows ten more; an interval later the
	// shared snapshot is taken again, and shows the session.
	setClock(clock.Add(time.Second))
	resp, _ = get(t, url+"/sessions?engine=one-too-many")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	setClock(clock.Add(time.Minute))
	resp, body = get(t, url+"/sessions")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var snap liveSnapshot
	require.NoError(t, json.Unmarshal(body, &snap))
	assert.Equal(t, []string{"s1=waiting"}, phasesOf(snap))
}

// Requests at once share one snapshot, and each gets it whole.
func TestLiveAskedSnapshotConcurrent(t *testing.T) {
	p, url := livePipelines(t, nil, func(l *LiveConfig) { l.Interval = time.Minute })
	defer p.shutdown(t)
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(start("s1", traceSlow, base))))
	const n = 3 * onDemandRate
	bodies := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(url + "/sessions") //nolint:gosec // the test's own server
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			bodies[i], err = io.ReadAll(resp.Body)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	for _, b := range bodies {
		assert.Equal(t, bodies[0], b)
	}
	var snap liveSnapshot
	require.NoError(t, json.Unmarshal(bodies[0], &snap))
	assert.Equal(t, []string{"s1=waiting"}, phasesOf(snap))
}

// sseClient reads snapshots from GET /sessions/stream.
type sseClient struct {
	resp *http.Response
	r    *bufio.Reader
}

func openStream(t *testing.T, url string) (*sseClient, *http.Response) {
	t.Helper()
	return openFilteredStream(t, url, "")
}

// openFilteredStream is openStream with query (?engine=, ?model=).
func openFilteredStream(t *testing.T, url, query string) (*sseClient, *http.Response) {
	t.Helper()
	resp, err := http.Get(url + "/sessions/stream" + query) //nolint:gosec // the test's own server
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		return nil, resp
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sseClient{resp: resp, r: bufio.NewReader(resp.Body)}, resp
}

// next returns the next snapshot's data.
func (c *sseClient) next(t *testing.T) liveSnapshot {
	t.Helper()
	for {
		line, err := c.r.ReadString('\n')
		require.NoError(t, err)
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var snap liveSnapshot
			require.NoError(t, json.Unmarshal([]byte(data), &snap))
			return snap
		}
	}
}

func TestLiveStream(t *testing.T) {
	p, url := livePipelines(t, nil, nil)
	defer p.shutdown(t)
	c, resp := openStream(t, url)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	first := c.next(t)
	assert.Empty(t, first.Sessions)

	// A session that starts shows up in a later snapshot, as it comes.
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(start("s1", traceSlow, base))))
	for snap := c.next(t); ; snap = c.next(t) {
		if len(snap.Sessions) == 1 {
			assert.Equal(t, "waiting", snap.Sessions[0].Phase)
			assert.True(t, snap.Time.After(first.Time) || snap.Time.Equal(first.Time))
			break
		}
	}
}

func TestLiveMaxViewers(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	p, url := livePipelines(t, tel, func(l *LiveConfig) { l.MaxViewers = 2 })
	defer p.shutdown(t)
	a, _ := openStream(t, url)
	b, _ := openStream(t, url)
	a.next(t)
	b.next(t)

	_, resp := openStream(t, url)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.JSONEq(t, `{"error":"too many viewers: live::max_viewers (2) are connected; try again later"}`, string(body))
	assert.Equal(t, int64(1), liveDrops(t, tel, "limit"))

	// A viewer that leaves makes room.
	a.resp.Body.Close()
	require.Eventually(t, func() bool {
		c, resp := openStream(t, url)
		if c == nil {
			resp.Body.Close()
			return false
		}
		c.next(t)
		return true
	}, 10*time.Second, 20*time.Millisecond)
}

func liveDrops(t *testing.T, tel *componenttest.Telemetry, cause string) int64 {
	t.Helper()
	m, err := tel.GetMetric("otelcol_processor_token_session_live_viewers_dropped")
	if err != nil {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value(attribute.Key("cause")); ok && v.AsString() == cause {
			n += dp.Value
		}
	}
	return n
}

// A viewer that never reads is dropped (counted as slow), its snapshots
// not queued; the others go on being served.
func TestLiveSlowViewerDropped(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	p, url := livePipelines(t, tel, func(l *LiveConfig) { l.MaxSessions = 5000 })
	defer p.shutdown(t)
	// Snapshots of about 2 MB fill the socket buffers in a few intervals.
	var evs []tokenevent.Event
	for i := range 5000 {
		evs = append(evs, start(fmt.Sprintf("session-%04d-%s", i, strings.Repeat("x", 200)), traceFast, base))
	}
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(evs...)))

	// A raw connection with a small receive buffer that sends the request
	// and never reads.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /sessions/stream HTTP/1.1\r\nHost: live\r\n\r\n")
	require.NoError(t, err)

	require.Eventually(t, func() bool { return liveDrops(t, tel, "slow") == 1 }, 30*time.Second, 20*time.Millisecond)
	good, resp := openStream(t, url)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Len(t, good.next(t).Sessions, 5000)
}

// Shutdown ends the streams: a viewer connected does not hold it up.
func TestLiveShutdownWithViewers(t *testing.T) {
	p, url := livePipelines(t, nil, nil)
	c, _ := openStream(t, url)
	c.next(t)
	p.shutdown(t)
	_, err := io.ReadAll(c.r)
	require.NoError(t, err, "the stream ends cleanly")
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

// applyPastLimits folds evs into c's table, each at its own time, without
// the limits a token event record is read with: the view must hold
// whatever the table holds.
func applyPastLimits(c *core, evs ...tokenevent.Event) {
	p := c.sessions
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range evs {
		p.setNow(time.Unix(0, int64(evs[i].TimeUnixNano)))
		p.reports = p.table.Apply(&evs[i], p.nowNanos, p.reports)
		p.handleReports(nil)
	}
}

// startOn is start on engine with model.
func startOn(id, engine, model string, at int64) tokenevent.Event {
	ev := start(id, traceFast, at)
	ev.Engine, ev.Model = engine, model
	return ev
}

func enginesOf(snap liveSnapshot) map[string]liveEngineJSON {
	out := make(map[string]liveEngineJSON)
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

	all := enginesOf(takeLive(t, c, now, liveFilter{}))
	require.Len(t, all, 3)
	assert.Equal(t, 2, all["vllm-0"].InFlight)
	assert.Equal(t, uint64(2), all["vllm-0"].TTFTCount)
	assert.Equal(t, 1, all["vllm-1"].InFlight)
	assert.Equal(t, uint64(1), all["vllm-1"].TTFTCount, "d's, ended")

	snap := takeLive(t, c, now, liveFilter{model: "mistral"})
	mistral := enginesOf(snap)
	require.Len(t, mistral, 2, "vllm-2 has no mistral session")
	assert.Equal(t, liveEngineJSON{
		Engine: "vllm-0", InFlight: 1, Decoding: 1, TokensPerSec: 0, TTFTP50Ms: mistral["vllm-0"].TTFTP50Ms,
		TTFTP99Ms: mistral["vllm-0"].TTFTP99Ms, TTFTCount: 1,
	}, mistral["vllm-0"], "b only, not llama's a")
	assert.InDelta(t, 200, *mistral["vllm-0"].TTFTP50Ms, 200*0.19)
	assert.Equal(t, 1, mistral["vllm-1"].Waiting)
	assert.Equal(t, uint64(1), mistral["vllm-1"].TTFTCount)
	assert.Equal(t, []string{"d"}, []string{snap.Recent[0].ID})

	snap = takeLive(t, c, now, liveFilter{model: "llama"})
	assert.Equal(t, []string{"vllm-0", "vllm-2"}, slices.Sorted(maps.Keys(enginesOf(snap))))
	assert.Empty(t, snap.Recent)
	assert.Equal(t, 1, enginesOf(snap)["vllm-0"].InFlight)

	snap = takeLive(t, c, now, liveFilter{engine: "vllm-1"})
	assert.Equal(t, []string{"vllm-1"}, slices.Sorted(maps.Keys(enginesOf(snap))))
	snap = takeLive(t, c, now, liveFilter{engine: "vllm-0", model: "llama"})
	require.Len(t, snap.Engines, 1)
	assert.Equal(t, 1, snap.Engines[0].InFlight)
	assert.Zero(t, snap.EnginesLeftOut)
}

// Past live::max_engines, the worst engines are listed (the most frozen,
// then stalled, then in flight), by name, and the rest are counted.
func TestLiveEnginesWorstListed(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	c := liveCoreWith(t, tel, func(l *LiveConfig) { l.MaxEngines = 2 })
	var evs []tokenevent.Event
	for e := 1; e <= 5; e++ {
		for i := range e {
			evs = append(evs, startOn(fmt.Sprintf("e%d-%d", e, i), fmt.Sprintf("e%d", e), "llama", base+100*ms))
		}
	}
	feed(t, c, evs...)
	now := liveScenario(t, c, base) // vllm-0: four in flight, one frozen

	snap := takeLive(t, c, now, liveFilter{})
	var names []string
	for _, e := range snap.Engines {
		names = append(names, e.Engine)
	}
	assert.Equal(t, []string{"e5", "vllm-0"}, names, "vllm-0 for its frozen session, e5 for its five in flight")
	assert.Equal(t, 4, snap.EnginesLeftOut)
	assert.Equal(t, int64(4), liveCount(t, tel, "otelcol_processor_token_session_live_engines_left_out"))
	assert.Equal(t, 4+15, snap.InFlight, "every session counted")

	snap = takeLive(t, c, now, liveFilter{engine: "e1"})
	assert.Zero(t, snap.EnginesLeftOut)
	assert.Len(t, snap.Engines, 1)
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
	c := liveCoreWith(t, tel, nil)
	engine := func(i int) string { return fmt.Sprintf("%0100d", i) }
	evs := make([]tokenevent.Event, 0, n)
	for i := range n {
		evs = append(evs, startOn(fmt.Sprintf("s%06d", i), engine(i), "llama", base))
	}
	_, invalid, err := c.sessions.fold(events(evs...), time.Unix(0, base))
	require.NoError(t, err)
	require.Zero(t, invalid)
	now := time.Unix(0, base+time.Second.Nanoseconds())

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	body := c.view.snapshot(now, liveFilter{}, &liveScan{})
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("one snapshot of %d sessions on as many engines: %d B of JSON, %d B allocated", n, len(body), allocated)
	var snap liveSnapshot
	require.NoError(t, json.Unmarshal(body, &snap))
	assert.Len(t, snap.Sessions, 500)
	assert.Len(t, snap.Engines, 64)
	assert.Equal(t, maxLiveCells-64, snap.EnginesLeftOut, "the engines tallied and not listed")
	assert.Equal(t, n-maxLiveCells, snap.SessionsUntallied, "the sessions of the engines past maxLiveCells")
	assert.Less(t, len(body), 512<<10, "the snapshot's JSON")
	assert.Less(t, allocated, uint64(16<<20), "what the pass allocates")
	assert.Equal(t, int64(n-maxLiveCells), liveCount(t, tel, "otelcol_processor_token_session_live_sessions_untallied"))

	body = c.view.snapshot(now, liveFilter{model: "no-such-model"}, &liveScan{})
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
	_, invalid, err = c.sessions.fold(events(evs...), time.Unix(0, base+200*ms))
	require.NoError(t, err)
	require.Zero(t, invalid)
	require.Zero(t, c.sessions.table.Active())
	assert.Len(t, c.view.ttft, maxLiveTTFTKeys)
	assert.Equal(t, int64(n-maxLiveTTFTKeys), liveCount(t, tel, "otelcol_processor_token_session_live_ttfts_overflowed"))
	body = c.view.snapshot(now, liveFilter{}, &liveScan{})
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
	c := liveCore(t, func(l *LiveConfig) { l.Attributes = []string{"tenant"} })
	long := func(prefix string) string { return prefix + strings.Repeat("é", 6000) } // 12 000 bytes and more
	ev := startOn(long("id-"), long("engine-"), long("model-"), base)
	ev.Operation = long("op-")
	ev.Attributes = []tokenevent.Attribute{{Key: "tenant", Value: long("tenant-")}}
	ended := startOn(long("ended-"), long("engine-"), long("model-"), base)
	endEv := end(ended.SessionID, base+200*ms)
	endEv.Error = long("error-")
	applyPastLimits(c, ev, tok(ev.SessionID, base+100*ms, 1), ended, tok(ended.SessionID, base+100*ms, 1), endEv)

	now := time.Unix(0, base+time.Second.Nanoseconds())
	body := c.view.snapshot(now, liveFilter{}, &liveScan{})
	assert.Less(t, len(body), 8<<10, "the snapshot of two sessions with 12 000-byte names")
	var snap liveSnapshot
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
	snap = takeLive(t, c, now, liveFilter{engine: row.Engine, model: row.Model})
	assert.Equal(t, 1, snap.Matching)
	assert.Len(t, snap.Engines, 1)
	assert.Len(t, snap.Recent, 1)

	// The ring's strings are the cut ones, not the session's.
	r := c.view.recent[0]
	for _, name := range []string{r.id, r.engine, r.model, r.errorType} {
		assert.LessOrEqual(t, len(name), liveMaxName+len(liveCut))
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

// One pass over the table per interval serves every viewer, whatever the
// number of viewers and filters: 1000 viewers each asking for a filter of
// its own are let in up to live::max_filters, the rest turned away (503),
// and those let in, and 100 more on those filters and on none, get the
// snapshot of their filter from one pass.
func TestLiveOnePassPerInterval(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	// An interval of an hour: the test makes the broadcaster's rounds.
	p, _ := livePipelines(t, tel, func(l *LiveConfig) { l.Interval = time.Hour; l.MaxViewers = 1000 })
	defer p.shutdown(t)
	ls := p.logs.(*logsProcessor).Unwrap().live
	var evs []tokenevent.Event
	for i := range 40 {
		evs = append(evs, startOn(fmt.Sprintf("s%d", i), "vllm-0", fmt.Sprintf("m-%d", i%20), base))
	}
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(evs...)))

	newViewer := func(f liveFilter) *liveViewer {
		return &liveViewer{filter: f, next: make(chan []byte, 1), gone: make(chan struct{})}
	}
	var in []*liveViewer
	refused := 0
	for i := range 900 {
		v := newViewer(liveFilter{model: fmt.Sprintf("m-%d", i)})
		cause, err := ls.join(v)
		if err != nil {
			assert.Equal(t, dropFilters, cause)
			refused++
			continue
		}
		in = append(in, v)
	}
	require.Equal(t, 16, len(in), "live::max_filters") //nolint:testifylint // not the 900 viewers' pointers in the message
	for i := range 100 {
		f := liveFilter{}
		if i%2 == 1 {
			f = in[i%16].filter
		}
		v := newViewer(f)
		_, err := ls.join(v)
		require.NoError(t, err, "a filter watched already, or none")
		in = append(in, v)
	}
	assert.Equal(t, 900-16, refused)

	require.True(t, ls.broadcastOnce(&liveBroadcast{}))
	assert.Equal(t, int64(1), liveCount(t, tel, "otelcol_processor_token_session_live_scans"), "one pass for 116 viewers on 17 filters")
	for _, v := range in {
		select {
		case data := <-v.next:
			var snap liveSnapshot
			require.NoError(t, json.Unmarshal(data, &snap))
			assert.Equal(t, v.filter.model, snap.Filter.Model)
			want := 40
			if v.filter.model != "" {
				want = 2
			}
			assert.Equal(t, want, snap.Matching, v.filter.model)
			assert.Len(t, snap.Sessions, want)
		default:
			t.Fatalf("viewer of %+v got no snapshot", v.filter)
		}
	}
}

// live::max_filters bounds the distinct filters watched; a viewer of one
// more is turned away (503, counted), and one of a filter watched, or of
// none, is let in.
func TestLiveMaxFilters(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	p, url := livePipelines(t, tel, func(l *LiveConfig) { l.MaxFilters = 1 })
	defer p.shutdown(t)
	a, resp := openFilteredStream(t, url, "?model=a")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	a.next(t)
	for _, q := range []string{"?model=a", ""} {
		c, resp := openFilteredStream(t, url, q)
		require.Equal(t, http.StatusOK, resp.StatusCode, q)
		c.next(t)
	}

	_, resp = openFilteredStream(t, url, "?model=b")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, "5", resp.Header.Get("Retry-After"))
	assert.JSONEq(t, `{"error":"too many filters: live::max_filters (1) distinct filters are being watched; watch one of them, or all sessions (no filter), or try again later"}`, string(body))
	assert.Equal(t, int64(1), liveDrops(t, tel, "filters"))
	assert.Zero(t, liveDrops(t, tel, "limit"))
}

// A filter longer than any name shown is a bad request.
func TestLiveFilterTooLong(t *testing.T) {
	p, url := livePipelines(t, nil, nil)
	defer p.shutdown(t)
	long := strings.Repeat("x", maxFilterValue+1)
	for _, path := range []string{"/sessions?engine=" + long, "/sessions/stream?model=" + long} {
		resp, body := get(t, url+path)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Contains(t, string(body), "at most 259 bytes (longer names are shown cut to 256, and filtered by what is shown)")
	}
	resp, _ := get(t, url+"/sessions?engine="+long[:maxFilterValue])
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// The snapshots kept for GET /sessions are at most live::max_filters + 1,
// however many filters are asked for over an interval.
func TestLiveAskedSnapshotsBounded(t *testing.T) {
	p, url := livePipelines(t, nil, func(l *LiveConfig) { l.Interval = time.Hour; l.MaxFilters = 4 })
	defer p.shutdown(t)
	ls := p.logs.(*logsProcessor).Unwrap().live
	clock := time.Now()
	for i := range 50 {
		ls.askMu.Lock()
		ls.mu.Lock()
		at := clock.Add(time.Duration(i) * time.Second) // within the rate
		ls.now = func() time.Time { return at }
		ls.mu.Unlock()
		ls.askMu.Unlock()
		resp, _ := get(t, url+fmt.Sprintf("/sessions?engine=e%d", i))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		ls.askMu.Lock()
		assert.LessOrEqual(t, len(ls.asked), 5)
		ls.askMu.Unlock()
	}
}
