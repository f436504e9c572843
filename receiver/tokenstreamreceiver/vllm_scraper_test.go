// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelcol-llm/otelcol-llm/internal/promconv"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

const textContentType = "text/plain; version=0.0.4; charset=utf-8"

func readFixture(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "fixtures", "vllm", "metrics-v1.prom"))
	require.NoError(t, err)
	return b
}

// metricsByName indexes the metrics of a single-resource, single-scope batch.
func metricsByName(t *testing.T, md pmetric.Metrics) map[string]pmetric.Metric {
	t.Helper()
	require.Equal(t, 1, md.ResourceMetrics().Len())
	sms := md.ResourceMetrics().At(0).ScopeMetrics()
	require.Equal(t, 1, sms.Len())
	assert.Equal(t, metadata.ScopeName, sms.At(0).Scope().Name())
	out := map[string]pmetric.Metric{}
	for _, m := range sms.At(0).Metrics().All() {
		_, dup := out[m.Name()]
		require.False(t, dup, "metric %s emitted twice", m.Name())
		out[m.Name()] = m
	}
	return out
}

// statusHost records the status events reported to it.
type statusHost struct {
	component.Host
	mu     sync.Mutex
	events []*componentstatus.Event
}

func (h *statusHost) Report(e *componentstatus.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
}

func (h *statusHost) recoverable() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, e := range h.events {
		if e.Status() == componentstatus.StatusRecoverableError {
			out = append(out, e.Err().Error())
		}
	}
	return out
}

type scrapeTest struct {
	sink *consumertest.MetricsSink
	tel  *componenttest.Telemetry
	host *statusHost
	logs *observer.ObservedLogs
}

// startScraping starts a metrics-only receiver scraping targets every 50 ms.
func startScraping(t *testing.T, targets []string, mutate func(*VLLMConfig)) *scrapeTest {
	t.Helper()
	cfg := createDefaultConfig().(*Config)
	v := cfg.VLLM.GetOrInsertDefault()
	v.Targets = targets
	v.Interval = 50 * time.Millisecond
	v.Timeout = 0
	if mutate != nil {
		mutate(v)
	}
	require.NoError(t, cfg.Validate())
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := receivertest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	core, logs := observer.New(zapcore.DebugLevel)
	set.Logger = zap.New(core)
	st := &scrapeTest{sink: new(consumertest.MetricsSink), tel: tel, host: &statusHost{Host: componenttest.NewNopHost()}, logs: logs}
	rcv, err := NewFactory().CreateMetrics(context.Background(), set, cfg, st.sink)
	require.NoError(t, err)
	require.NoError(t, rcv.Start(context.Background(), st.host))
	t.Cleanup(func() { require.NoError(t, rcv.Shutdown(context.Background())) })
	return st
}

// fixtureServer serves the fixture exposition.
func fixtureServer(t *testing.T) *httptest.Server {
	t.Helper()
	body := readFixture(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", textContentType)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// instance is the service.instance.id of a test server's URL.
func instance(t *testing.T, rawURL string) string {
	t.Helper()
	return strings.TrimSuffix(strings.TrimPrefix(rawURL, "http://"), "/metrics")
}

// scrapesFrom counts the batches the sink got from the target with the given
// service.instance.id.
func (st *scrapeTest) scrapesFrom(id string) int {
	n := 0
	for _, md := range st.sink.AllMetrics() {
		for _, rm := range md.ResourceMetrics().All() {
			if v, ok := rm.Resource().Attributes().Get("service.instance.id"); ok && v.Str() == id {
				n++
			}
		}
	}
	return n
}

func (st *scrapeTest) scrapeErrors(t *testing.T, target, reason string) int64 {
	t.Helper()
	m, err := st.tel.GetMetric("otelcol_receiver_token_stream_failed_scrapes")
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		tv, _ := dp.Attributes.Value("target")
		rv, _ := dp.Attributes.Value("reason")
		if tv.AsString() == target && rv.AsString() == reason {
			total += dp.Value
		}
		// The component is named by the otelcol.component.id the collector
		// adds, not by an attribute of the receiver's own.
		assert.Equal(t, 2, dp.Attributes.Len(), "attributes: target and reason")
	}
	return total
}

func TestScrapeFixture(t *testing.T) {
	srv := fixtureServer(t)
	target := srv.URL + "/metrics"
	st := startScraping(t, []string{target}, nil)
	require.Eventually(t, func() bool { return st.scrapesFrom(instance(t, target)) >= 2 }, 5*time.Second, 10*time.Millisecond)

	md := st.sink.AllMetrics()[0]
	res := md.ResourceMetrics().At(0).Resource().Attributes()
	host, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	portNum, _ := strconv.ParseInt(port, 10, 64)
	assert.Equal(t, map[string]any{
		"server.address":      host,
		"server.port":         portNum,
		"service.instance.id": net.JoinHostPort(host, port),
	}, res.AsRaw())
	got := metricsByName(t, md)
	assert.Equal(t, pmetric.MetricTypeGauge, got["vllm:kv_cache_usage_perc"].Type())
	assert.Equal(t, pmetric.MetricTypeSum, got["vllm:num_preemptions_total"].Type())
	assert.Equal(t, pmetric.MetricTypeHistogram, got["vllm:inter_token_latency_seconds"].Type())
	assert.Empty(t, st.host.recoverable())
}

func TestScrapeSendsAcceptHeader(t *testing.T) {
	accept := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case accept <- r.Header.Get("Accept"):
		default:
		}
		_, _ = w.Write([]byte("x 1\n"))
	}))
	t.Cleanup(srv.Close)
	startScraping(t, []string{srv.URL + "/metrics"}, nil)
	select {
	case a := <-accept:
		assert.True(t, strings.HasPrefix(a, "text/plain;version=0.0.4"), a)
	case <-time.After(5 * time.Second):
		t.Fatal("no scrape")
	}
}

// TestScrapeOneTargetFails: whatever the failure of one target, the other
// keeps delivering, and the failure is counted, reported and logged.
func TestScrapeOneTargetFails(t *testing.T) {
	const maxBody = 64 << 10
	big := strings.Repeat("# padding padding padding padding padding padding\n", 2*maxBody/50)
	for _, tc := range []struct {
		reason string
		bad    func(t *testing.T) string // returns the failing target
	}{
		{reasonStatus, func(t *testing.T) string {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "boom", http.StatusInternalServerError)
			}))
			t.Cleanup(srv.Close)
			return srv.URL + "/metrics"
		}},
		{reasonParse, func(t *testing.T) string {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				_, _ = w.Write([]byte("<html><body>hello</body></html>\n"))
			}))
			t.Cleanup(srv.Close)
			return srv.URL + "/metrics"
		}},
		{reasonConnection, func(t *testing.T) string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			addr := ln.Addr().String()
			require.NoError(t, ln.Close())
			return "http://" + addr + "/metrics"
		}},
		{reasonOversized, func(t *testing.T) string { // Content-Length announced
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(len(big)))
				_, _ = w.Write([]byte(big))
			}))
			t.Cleanup(srv.Close)
			return srv.URL + "/metrics"
		}},
		{reasonOversized, func(t *testing.T) string { // chunked, no length
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				for i := 0; i < len(big); i += 4096 {
					if _, err := w.Write([]byte(big[i:min(i+4096, len(big))])); err != nil {
						return
					}
					w.(http.Flusher).Flush()
				}
			}))
			t.Cleanup(srv.Close)
			return srv.URL + "/metrics"
		}},
		{reasonTimeout, func(t *testing.T) string {
			srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
			}))
			t.Cleanup(srv.Close)
			return srv.URL + "/metrics"
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			good := fixtureServer(t).URL + "/metrics"
			bad := tc.bad(t)
			st := startScraping(t, []string{bad, good}, func(v *VLLMConfig) {
				v.MaxBodyBytes = maxBody
				// Short only where the timeout is what fails: a busy machine
				// can hold any scrape for tens of ms, which would turn a
				// status or parse failure into a timeout and report the
				// target twice, under two reasons.
				v.Interval, v.Timeout = 250*time.Millisecond, 250*time.Millisecond
				if tc.reason == reasonTimeout {
					v.Interval, v.Timeout = 50*time.Millisecond, 40*time.Millisecond
				}
			})
			require.Eventually(t, func() bool {
				return st.scrapesFrom(instance(t, good)) >= 3 && st.scrapeErrors(t, bad, tc.reason) >= 3
			}, 10*time.Second, 10*time.Millisecond)
			assert.Zero(t, st.scrapesFrom(instance(t, bad)))

			// Reported once as a recoverable error naming the target.
			var rec []string
			for _, e := range st.host.recoverable() {
				if strings.Contains(e, bad) {
					rec = append(rec, e)
				}
			}
			require.Len(t, rec, 1)
			assert.Contains(t, rec[0], "("+tc.reason+")")
			// Logged once (rate-limited to once a minute per target).
			warns := st.logs.FilterMessage("vllm scrape failed").FilterField(zap.String("target", bad)).All()
			require.Len(t, warns, 1)
			assert.Equal(t, tc.reason, warns[0].ContextMap()["reason"])
		})
	}
}

func TestScrapeRecovers(t *testing.T) {
	body := readFixture(t)
	var mu sync.Mutex
	failing := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		f := failing
		mu.Unlock()
		if f {
			http.Error(w, "warming up", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	target := srv.URL + "/metrics"
	st := startScraping(t, []string{target}, nil)
	require.Eventually(t, func() bool { return st.scrapeErrors(t, target, reasonStatus) >= 1 }, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	failing = false
	mu.Unlock()
	require.Eventually(t, func() bool { return st.scrapesFrom(instance(t, target)) >= 1 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		st.host.mu.Lock()
		defer st.host.mu.Unlock()
		last := st.host.events[len(st.host.events)-1]
		return last.Status() == componentstatus.StatusOK
	}, 5*time.Second, 10*time.Millisecond)
	assert.Len(t, st.logs.FilterMessage("vllm scrape recovered").All(), 1)
}

// TestShutdownDeliversScrapeInFlight: a scrape being handed over when the
// receiver shuts down is delivered, not cancelled. A cancelled hand-over
// aborted the exporter's request mid-body (the backend refused a truncated
// body) and lost the engine's last state.
func TestShutdownDeliversScrapeInFlight(t *testing.T) {
	srv := fixtureServer(t)
	cfg := createDefaultConfig().(*Config)
	v := cfg.VLLM.GetOrInsertDefault()
	v.Targets = []string{srv.URL + "/metrics"}
	v.Interval = time.Hour // the first scrape only
	hold := newHoldingConsumer()
	rcv, err := NewFactory().CreateMetrics(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, hold)
	require.NoError(t, err)
	require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
	hold.assertShutdownDelivers(t, rcv)
}

// TestLifecycleLogsAndMetrics: the logs and metrics instances of one
// component share one receiver, started and stopped once.
func TestLifecycleLogsAndMetrics(t *testing.T) {
	srv := fixtureServer(t)
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	v := cfg.VLLM.GetOrInsertDefault()
	v.Targets = []string{srv.URL + "/metrics"}
	v.Interval = 20 * time.Millisecond
	require.NoError(t, cfg.Validate())
	f := NewFactory()
	set := receivertest.NewNopSettings(metadata.Type)

	// Shutdown without Start.
	lr, err := f.CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	mr, err := f.CreateMetrics(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.Same(t, lr, mr)
	require.NoError(t, lr.Shutdown(context.Background()))
	require.NoError(t, mr.Shutdown(context.Background()))

	var previous *tokenStreamReceiver
	for range 2 {
		logs := new(consumertest.LogsSink)
		metrics := new(consumertest.MetricsSink)
		lr, err := f.CreateLogs(context.Background(), set, cfg, logs)
		require.NoError(t, err)
		mr, err := f.CreateMetrics(context.Background(), set, cfg, metrics)
		require.NoError(t, err)
		require.Same(t, lr, mr, "one receiver for both signals")
		r := lr.(*tokenStreamReceiver)
		require.NotSame(t, previous, r, "a shut down receiver is not reused")
		previous = r

		host := componenttest.NewNopHost()
		require.NoError(t, lr.Start(context.Background(), host))
		require.NoError(t, mr.Start(context.Background(), host))
		require.NotNil(t, r.http, "hooks started: there is a logs consumer")
		require.NotNil(t, r.vllm, "scraper started: there is a metrics consumer")

		code, _, br := post(t, "http://"+r.http.Addr.String()+"/v1/token-events", "application/x-ndjson", startLine+"\n")
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, 1, br.Accepted)
		require.Eventually(t, func() bool { return metrics.DataPointCount() > 0 }, 5*time.Second, 10*time.Millisecond)
		assert.Equal(t, 1, logs.LogRecordCount())

		require.NoError(t, lr.Shutdown(context.Background()))
		require.NoError(t, mr.Shutdown(context.Background()))
		require.NoError(t, lr.Shutdown(context.Background()))
		assert.Nil(t, r.vllm)
		assert.Nil(t, r.http)
	}
}

// A receiver only in a metrics pipeline does not start the hooks, one only
// in a logs pipeline does not scrape.
func TestSourcesFollowConsumers(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	v := cfg.VLLM.GetOrInsertDefault()
	v.Targets = []string{"http://127.0.0.1:1/metrics"}
	f := NewFactory()
	set := receivertest.NewNopSettings(metadata.Type)

	mr, err := f.CreateMetrics(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.NoError(t, mr.Start(context.Background(), componenttest.NewNopHost()))
	assert.Nil(t, mr.(*tokenStreamReceiver).http)
	assert.NotNil(t, mr.(*tokenStreamReceiver).vllm)
	require.NoError(t, mr.Shutdown(context.Background()))

	lr, err := f.CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.NoError(t, lr.Start(context.Background(), componenttest.NewNopHost()))
	assert.NotNil(t, lr.(*tokenStreamReceiver).http)
	assert.Nil(t, lr.(*tokenStreamReceiver).vllm)
	require.NoError(t, lr.Shutdown(context.Background()))
}

// TestScrapeRedactsTargetCredentials: the user name, password and query
// values of a target URL reach neither logs, nor status, nor telemetry, nor
// the resource; the scrape itself still sends them.
func TestScrapeRedactsTargetCredentials(t *testing.T) {
	const user, pass, token = "alice-user", "s3cret-pass", "tok-123456"
	var gotAuth, gotToken atomic.Value
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, _ := r.BasicAuth()
		gotAuth.Store(u + ":" + p)
		gotToken.Store(r.URL.Query().Get("token"))
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	t.Cleanup(bad.Close)
	good := fixtureServer(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())

	withCreds := func(base string) string {
		return strings.Replace(base, "http://", "http://"+user+":"+pass+"@", 1) + "/metrics?token=" + token + "&x=1"
	}
	targets := []string{withCreds(bad.URL), withCreds(good.URL), withCreds("http://" + closedAddr)}
	// A timeout the good target meets even on a loaded machine: its
	// failure would add a third recoverable status below.
	st := startScraping(t, targets, func(v *VLLMConfig) { v.Interval, v.Timeout = 500*time.Millisecond, 500*time.Millisecond })
	require.Eventually(t, func() bool {
		return st.scrapesFrom(instance(t, good.URL+"/metrics")) >= 2 &&
			st.scrapeErrors(t, redactedTarget(bad.URL), reasonStatus) >= 2 &&
			st.scrapeErrors(t, redactedTarget("http://"+closedAddr), reasonConnection) >= 2
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, user+":"+pass, gotAuth.Load())
	assert.Equal(t, token, gotToken.Load())

	secrets := []string{user, pass, token}
	noSecret := func(where, s string) {
		t.Helper()
		for _, sec := range secrets {
			assert.NotContains(t, s, sec, where)
		}
	}
	for _, e := range st.logs.All() {
		noSecret("log message", e.Message)
		for k, v := range e.ContextMap() {
			noSecret("log field "+k, fmt.Sprint(v))
		}
	}
	require.Len(t, st.host.recoverable(), 2)
	for _, e := range st.host.recoverable() {
		noSecret("status", e)
	}
	m, err := st.tel.GetMetric("otelcol_receiver_token_stream_failed_scrapes")
	require.NoError(t, err)
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		for _, kv := range dp.Attributes.ToSlice() {
			noSecret("failed_scrapes attribute", kv.Value.String())
		}
	}
	for _, md := range st.sink.AllMetrics() {
		for _, rm := range md.ResourceMetrics().All() {
			for k, v := range rm.Resource().Attributes().All() {
				noSecret("resource attribute "+k, v.AsString())
			}
		}
	}
}

// redactedTarget is the target attribute of base+"/metrics?token=…&x=1"
// with credentials.
func redactedTarget(base string) string {
	return strings.Replace(base, "http://", "http://xxxxx@", 1) + "/metrics?token=xxxxx&x=xxxxx"
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://host:8000/metrics":                  "http://host:8000/metrics",
		"https://u:p@host/metrics":                  "https://xxxxx@host/metrics",
		"https://tokenonly@host/metrics":            "https://xxxxx@host/metrics",
		"http://host/metrics?api_key=k&name=a#frag": "http://host/metrics?api_key=xxxxx&name=xxxxx",
	} {
		u, err := url.Parse(in)
		require.NoError(t, err)
		assert.Equal(t, want, redactURL(u), in)
	}
}

// TestScrapeOpenMetricsAllTypes: an OpenMetrics answer with info, stateset,
// exemplars, a gauge histogram, a summary and an invalid histogram is
// scraped, not failed: the unsupported families alone are skipped and
// counted, the invalid histogram point counted.
func TestScrapeOpenMetricsAllTypes(t *testing.T) {
	body := "# TYPE vllm:cache_config info\n" +
		"vllm:cache_config_info{block_size=\"16\"} 1.0\n" +
		"# TYPE engine_state stateset\n" +
		"engine_state{engine_state=\"running\"} 1\n" +
		"# TYPE vllm:request_success counter\n" +
		"vllm:request_success_total{engine=\"0\"} 7.0 # {trace_id=\"0123456789abcdef\"} 1.0 1754000000.5\n" +
		"# TYPE queue_depth gaugehistogram\n" +
		"queue_depth_bucket{le=\"+Inf\"} 2\nqueue_depth_gcount 2\n" +
		"# TYPE rpc_seconds summary\nrpc_seconds_sum 2\nrpc_seconds_count 3\n" +
		"# TYPE bad histogram\nbad_bucket{le=\"1\"} 4\nbad_bucket{le=\"+Inf\"} 2\nbad_count 3\n" +
		"# EOF\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	target := srv.URL + "/metrics"
	st := startScraping(t, []string{target}, nil)
	require.Eventually(t, func() bool { return st.scrapesFrom(instance(t, target)) >= 2 }, 10*time.Second, 10*time.Millisecond)
	assert.Zero(t, st.scrapeErrors(t, target, reasonParse))

	got := metricsByName(t, st.sink.AllMetrics()[0])
	for _, name := range []string{"vllm:cache_config_info", "engine_state", "vllm:request_success_total"} {
		assert.Contains(t, got, name)
	}
	for _, name := range []string{"queue_depth", "queue_depth_bucket", "rpc_seconds"} {
		assert.NotContains(t, got, name)
	}
	if bad, ok := got["bad"]; ok {
		assert.Zero(t, bad.Histogram().DataPoints().Len())
	}

	skipped := map[string]int64{}
	m, err := st.tel.GetMetric("otelcol_receiver_token_stream_skipped_families")
	require.NoError(t, err)
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		r, _ := dp.Attributes.Value("reason")
		skipped[r.AsString()] += dp.Value
	}
	scrapes := int64(st.scrapesFrom(instance(t, target)))
	assert.GreaterOrEqual(t, skipped["gaugehistogram"], scrapes)
	assert.GreaterOrEqual(t, skipped["summary"], scrapes)
	assert.Len(t, skipped, 2)
	inv, err := st.tel.GetMetric("otelcol_receiver_token_stream_invalid_data_points")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, inv.Data.(metricdata.Sum[int64]).DataPoints[0].Value, scrapes)
}

// TestEngineNameMatchesScraper: the proxy's engine name for its upstream
// is the service.instance.id the scraper gives the same engine's target,
// default ports included, so that sessions find their engine's state.
func TestEngineNameMatchesScraper(t *testing.T) {
	for upstream, want := range map[string]string{
		"http://host/":           "host:80",
		"https://host/":          "host:443",
		"http://host:8000/":      "host:8000",
		"http://[::1]/":          "[::1]:80",
		"https://u:p@host:8443/": "host:8443",
	} {
		u, err := url.Parse(upstream)
		require.NoError(t, err)
		assert.Equal(t, want, engineName(u), upstream)

		target, err := url.Parse(strings.TrimSuffix(upstream, "/") + "/metrics")
		require.NoError(t, err)
		res := pmetric.NewMetrics().ResourceMetrics().AppendEmpty().Resource()
		promconv.TargetResource(target)(res)
		id, ok := res.Attributes().Get("service.instance.id")
		require.True(t, ok)
		assert.Equal(t, engineName(u), id.Str(), "scraper and proxy name %s alike", upstream)
	}
}

// TestProxyEngineNameHasDefaultPort: a proxy in front of http://host/ names
// its sessions' engine host:80, as the scraper names that engine.
func TestProxyEngineNameHasDefaultPort(t *testing.T) {
	for upstream, want := range map[string]string{
		"http://localhost/":   "localhost:80",
		"https://localhost/":  "localhost:443",
		"http://localhost:1/": "localhost:1",
	} {
		sink := new(consumertest.LogsSink)
		tr := startProxyReceiver(t, upstream, sink, func(p *ProxyConfig) { p.Upstream.ResponseHeaderTimeout = 2 * time.Second })
		postStream(t, tr) // whatever answers there, the session names its engine
		assert.Equal(t, want, proxyEvents(t, sink)[0].Engine, upstream)
	}
}
