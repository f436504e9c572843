// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// liveServerOf starts token_session in all three pipelines with the live
// view on 127.0.0.1:0, and returns its base URL.
func liveServerOf(t *testing.T, p *pipelines) string {
	t.Helper()
	c := p.logs.(*logsProcessor).Unwrap()
	require.NotNil(t, c.live)
	return "http://" + c.live.Addr().String()
}

func livePipelines(t *testing.T, set *componenttest.Telemetry, mutate func(*live.Config)) (*pipelines, string) {
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
	p, url := livePipelines(t, nil, func(l *live.Config) { l.TraceURL = "https://tempo.example/trace/{trace_id}" })
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
	var snap live.Snapshot
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

// Requests at once share one snapshot, and each gets it whole.
func TestLiveAskedSnapshotConcurrent(t *testing.T) {
	p, url := livePipelines(t, nil, func(l *live.Config) { l.Interval = time.Minute })
	defer p.shutdown(t)
	require.NoError(t, p.logs.ConsumeLogs(context.Background(), events(start("s1", traceSlow, base))))
	const n = 30 // three times the snapshots a second taken on requests
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
	var snap live.Snapshot
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
func (c *sseClient) next(t *testing.T) live.Snapshot {
	t.Helper()
	for {
		line, err := c.r.ReadString('\n')
		require.NoError(t, err)
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var snap live.Snapshot
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
	p, url := livePipelines(t, tel, func(l *live.Config) { l.MaxViewers = 2 })
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
	p, url := livePipelines(t, tel, func(l *live.Config) { l.MaxSessions = 5000 })
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

// live::max_filters bounds the distinct filters watched; a viewer of one
// more is turned away (503, counted), and one of a filter watched, or of
// none, is let in.
func TestLiveMaxFilters(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	p, url := livePipelines(t, tel, func(l *live.Config) { l.MaxFilters = 1 })
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
