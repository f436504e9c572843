// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenparse"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

const (
	startLine = `{"event":"start","session_id":"s-1","time_unix_nano":1700000000000000000,"trace_id":"0af7651916cd43dd8448eb211c80319c","model":"llama","operation":"chat","prompt_tokens":12}`
	tok1      = `{"event":"token","session_id":"s-1","time_unix_nano":1700000000200000000}`
	tok2      = `{"event":"token","session_id":"s-1","time_unix_nano":1700000000230000000,"count":2}`
	endLine   = `{"event":"end","session_id":"s-1","time_unix_nano":1700000000300000000,"completion_tokens":3,"finish_reason":"stop"}`
)

// testReceiver is a started receiver on loopback ports chosen by the OS.
type testReceiver struct {
	r    *tokenStreamReceiver
	tel  *componenttest.Telemetry
	url  string
	udp  string
	sink *consumertest.LogsSink
	// warnings holds what the receiver logged at warn level and above.
	warnings *observer.ObservedLogs
}

func startReceiver(t *testing.T, next consumer.Logs, mutate func(*Config)) *testReceiver {
	t.Helper()
	cfg := createDefaultConfig().(*Config)
	h := cfg.Hooks.HTTP.GetOrInsertDefault()
	h.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	u := cfg.Hooks.UDP.GetOrInsertDefault()
	u.Endpoint = "127.0.0.1:0"
	if mutate != nil {
		mutate(cfg)
	}
	require.NoError(t, cfg.Validate())
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := receivertest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	core, warnings := observer.New(zapcore.WarnLevel)
	set.Logger = zap.New(core)
	sink, _ := next.(*consumertest.LogsSink)
	rcv, err := NewFactory().CreateLogs(context.Background(), set, cfg, next)
	require.NoError(t, err)
	require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, rcv.Shutdown(context.Background())) })
	tr := &testReceiver{r: rcv.(*tokenStreamReceiver), tel: tel, sink: sink, warnings: warnings}
	if tr.r.http != nil {
		tr.url = "http://" + tr.r.http.Addr.String() + h.Path
	}
	if tr.r.udp != nil {
		tr.udp = tr.r.udp.conn.LocalAddr().String()
	}
	return tr
}

func post(t *testing.T, url, contentType, body string) (int, http.Header, batchResponse) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, http.Header, batchResponse) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var br batchResponse
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &br), string(raw))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	return resp.StatusCode, resp.Header, br
}

// events decodes everything the sink received back into wire events.
func events(t *testing.T, sink *consumertest.LogsSink) []string {
	t.Helper()
	var out []string
	var ev tokenevent.Event
	for _, ld := range sink.AllLogs() {
		for _, rl := range ld.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				assert.Equal(t, metadata.ScopeName, sl.Scope().Name())
				for _, lr := range sl.LogRecords().All() {
					require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
						out = append(out, strings.TrimSpace(string(tokenevent.AppendJSON(nil, e))))
					}))
				}
			}
		}
	}
	return out
}

func counter(t *testing.T, tel *componenttest.Telemetry, name, transport string) int64 {
	t.Helper()
	m, err := tel.GetMetric(name)
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value("transport"); ok && v.AsString() == transport {
			total += dp.Value
		}
		assert.Equal(t, 1, dp.Attributes.Len(), "attributes: transport")
	}
	return total
}

func TestLifecycle(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	cfg.Hooks.UDP.GetOrInsertDefault().Endpoint = "127.0.0.1:0"
	f := NewFactory()
	set := receivertest.NewNopSettings(metadata.Type)

	// Shutdown without Start.
	rcv, err := f.CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.NoError(t, rcv.Shutdown(context.Background()))

	// Create, start, shut down: twice, on the same ports.
	for range 2 {
		rcv, err := f.CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
		require.NoError(t, err)
		require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
		require.NoError(t, rcv.Shutdown(context.Background()))
		require.NoError(t, rcv.Shutdown(context.Background()))
	}
}

func TestStartFailsOnBusyPort(t *testing.T) {
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	cfg.Hooks.UDP.GetOrInsertDefault().Endpoint = ln.LocalAddr().String()
	rcv, err := NewFactory().CreateLogs(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
	require.NoError(t, err)
	err = rcv.Start(context.Background(), componenttest.NewNopHost())
	require.ErrorContains(t, err, "hooks::udp: listen on "+ln.LocalAddr().String())
	// The HTTP server started before the failure is stopped again.
	require.NoError(t, rcv.Shutdown(context.Background()))
}

func TestHTTPBatch(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), nil)
	body := strings.Join([]string{startLine, tok1, tok2, endLine}, "\n") + "\n"
	status, _, resp := post(t, tr.url, "application/x-ndjson", body)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, batchResponse{Accepted: 4, Rejected: 0, Errors: []lineError{}}, resp)
	assert.Equal(t, []string{startLine, tok1, tok2, endLine}, events(t, tr.sink))
	// Two tokens of one session travel as one packed record.
	assert.Equal(t, 3, tr.sink.LogRecordCount())
	assert.Equal(t, int64(4), counter(t, tr.tel, "otelcol_receiver_token_stream_accepted_events", "http"))
}

// A share line (the vLLM plugin's engine core) is taken beside the session's
// events and travels as a record of its own, read back as it came; one
// naming a session instead of the engine's request is refused.
func TestHTTPShareLines(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), nil)
	share := `{"event":"share","engine_request_id":"chatcmpl-s-1-0a1b2c3d","time_unix_nano":1700000001000000001,"engine":"vllm-0","engine_time_prefill_ns":41000123,"engine_time_decode_ns":96500456}`
	body := strings.Join([]string{startLine, tok1, endLine, share, `{"event":"share","session_id":"s-1","time_unix_nano":1}`}, "\n")
	status, _, resp := post(t, tr.url, "application/x-ndjson", body)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, batchResponse{Accepted: 4, Rejected: 1, Errors: []lineError{{5, "engine_request_id: missing"}}}, resp)
	assert.Equal(t, []string{startLine, tok1, endLine, share}, events(t, tr.sink))
}

func TestHTTPPartialBatch(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), nil)
	body := strings.Join([]string{
		startLine,
		`{"event":"token","session_id":"s-1","time_unix_nano":1,"trace_id":"0af7651916cd43dd8448eb211c80319"}`,
		`{"event":"tick","session_id":"s-1","time_unix_nano":1}`,
		`{"event":"token","time_unix_nano":1}`,
		`{"event":"token","session_id":"s-1",`,
		tok1,
	}, "\n")
	status, _, resp := post(t, tr.url, "application/x-ndjson; charset=utf-8", body)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, batchResponse{Accepted: 2, Rejected: 4, Errors: []lineError{
		{2, "trace_id: want 32 hex digits, got 31"},
		{3, `event: want start, token, end, share or move, got "tick"`},
		{4, "session_id: missing"},
		{5, "invalid JSON: want a string key, got end of line"},
	}}, resp)
	assert.Equal(t, []string{startLine, tok1}, events(t, tr.sink))
	assert.Equal(t, int64(2), counter(t, tr.tel, "otelcol_receiver_token_stream_accepted_events", "http"))
	assert.Equal(t, int64(4), counter(t, tr.tel, "otelcol_receiver_token_stream_rejected_events", "http"))
}

func TestHTTPKeepsFirstTenErrors(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), nil)
	status, _, resp := post(t, tr.url, "application/json", strings.Repeat("{}\n", 25))
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, 0, resp.Accepted)
	assert.Equal(t, 25, resp.Rejected)
	require.Len(t, resp.Errors, 10)
	assert.Equal(t, lineError{10, "event: missing"}, resp.Errors[9])
	assert.Equal(t, 0, tr.sink.LogRecordCount())
	assert.Equal(t, int64(25), counter(t, tr.tel, "otelcol_receiver_token_stream_rejected_events", "http"))
}

func TestHTTPEdgeCases(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), func(c *Config) {
		c.Hooks.HTTP.Get().ServerConfig.MaxRequestBodySize = 1024
		c.Hooks.Limits.MaxLinesPerBatch = 2
	})

	t.Run("empty body", func(t *testing.T) {
		status, _, resp := post(t, tr.url, "application/x-ndjson", "")
		assert.Equal(t, http.StatusBadRequest, status)
		assert.Equal(t, "body holds no token events", resp.Error)
	})
	t.Run("blank lines only", func(t *testing.T) {
		status, _, resp := post(t, tr.url, "application/x-ndjson", "\n \r\n\n")
		assert.Equal(t, http.StatusBadRequest, status)
		assert.Equal(t, "body holds no token events", resp.Error)
	})
	t.Run("wrong content type", func(t *testing.T) {
		status, _, resp := post(t, tr.url, "application/x-www-form-urlencoded", tok1)
		assert.Equal(t, http.StatusUnsupportedMediaType, status)
		assert.Equal(t, `content type "application/x-www-form-urlencoded" not supported: send application/x-ndjson`, resp.Error)
	})
	t.Run("no content type", func(t *testing.T) {
		status, _, _ := post(t, tr.url, "", tok1)
		assert.Equal(t, http.StatusUnsupportedMediaType, status)
	})
	t.Run("GET", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, tr.url, nil)
		status, hdr, _ := do(t, req)
		assert.Equal(t, http.StatusMethodNotAllowed, status)
		assert.Equal(t, "POST", hdr.Get("Allow"))
	})
	t.Run("too large", func(t *testing.T) {
		status, _, resp := post(t, tr.url, "application/x-ndjson", strings.Repeat(tok1+"\n", 20))
		assert.Equal(t, http.StatusRequestEntityTooLarge, status)
		assert.Equal(t, "body larger than max_request_body_size (1024 bytes)", resp.Error)
	})
	t.Run("too many lines", func(t *testing.T) {
		status, _, resp := post(t, tr.url, "application/x-ndjson", tok1+"\n"+tok1+"\n"+tok1)
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, 2, resp.Accepted)
		assert.Equal(t, []lineError{{3, "batch holds more than 2 lines: this line and the 0 after it not read"}}, resp.Errors)
	})
	t.Run("gzip", func(t *testing.T) {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write([]byte(tok1 + "\n" + tok2))
		require.NoError(t, zw.Close())
		req, _ := http.NewRequest(http.MethodPost, tr.url, &buf)
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Content-Encoding", "gzip")
		status, _, resp := do(t, req)
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, 2, resp.Accepted)
	})
	t.Run("other path", func(t *testing.T) {
		status, _, resp := post(t, strings.TrimSuffix(tr.url, "/v1/token-events")+"/v1/logs", "application/x-ndjson", tok1)
		assert.Equal(t, http.StatusNotFound, status)
		assert.Equal(t, "no token event endpoint at /v1/logs: POST batches to /v1/token-events", resp.Error)
	})
	t.Run("bad gzip", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, tr.url, strings.NewReader("not gzip"))
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Content-Encoding", "gzip")
		status, _, resp := do(t, req)
		assert.Equal(t, http.StatusBadRequest, status)
		assert.NotEmpty(t, resp.Error)
	})
}

func TestHTTPPipelineRefuses(t *testing.T) {
	t.Run("retryable", func(t *testing.T) {
		tr := startReceiver(t, consumertest.NewErr(errors.New("queue is full")), nil)
		status, hdr, resp := post(t, tr.url, "application/x-ndjson", tok1+"\n{}")
		assert.Equal(t, http.StatusServiceUnavailable, status)
		assert.Equal(t, "1", hdr.Get("Retry-After"))
		assert.Equal(t, batchResponse{Accepted: 0, Rejected: 1, Errors: []lineError{{2, "event: missing"}}, Error: "pipeline refused the batch: queue is full"}, resp)
		assert.Equal(t, int64(1), counter(t, tr.tel, "otelcol_receiver_token_stream_refused_events", "http"))
		assert.Equal(t, int64(0), counter(t, tr.tel, "otelcol_receiver_token_stream_accepted_events", "http"))
		m, err := tr.tel.GetMetric("otelcol_receiver_refused_log_records")
		require.NoError(t, err)
		assert.Equal(t, int64(1), m.Data.(metricdata.Sum[int64]).DataPoints[0].Value)
	})
	t.Run("permanent", func(t *testing.T) {
		tr := startReceiver(t, consumertest.NewErr(consumererror.NewPermanent(errors.New("bad data"))), nil)
		status, hdr, resp := post(t, tr.url, "application/x-ndjson", tok1)
		assert.Equal(t, http.StatusBadRequest, status)
		assert.Empty(t, hdr.Get("Retry-After"))
		assert.Equal(t, "pipeline refused the batch: Permanent error: bad data", resp.Error)
	})
}

func TestHTTPOnly(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), func(c *Config) { c.Hooks.UDP = configoptional.None[UDPConfig]() })
	assert.Nil(t, tr.r.udp)
	status, _, _ := post(t, tr.url, "application/x-ndjson", tok1)
	assert.Equal(t, http.StatusOK, status)
}

func sendUDP(t *testing.T, addr string, datagrams ...string) {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	require.NoError(t, err)
	defer conn.Close()
	for _, d := range datagrams {
		_, err := conn.Write([]byte(d))
		require.NoError(t, err)
	}
}

func TestUDP(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), func(c *Config) { c.Hooks.HTTP = configoptional.None[HTTPConfig]() })
	sendUDP(t, tr.udp,
		startLine+"\n"+tok1,
		"\x00\xffgarbage",
		tok2+"\n"+`{"event":"end"}`,
		endLine+"\n",
	)
	require.Eventually(t, func() bool {
		return counter(t, tr.tel, "otelcol_receiver_token_stream_accepted_events", "udp") == 4 &&
			counter(t, tr.tel, "otelcol_receiver_token_stream_rejected_events", "udp") == 2
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, []string{startLine, tok1, tok2, endLine}, events(t, tr.sink))
	// UDP has no answer: the rejected lines are said in the log (once a
	// minute), with the first line's error.
	warned := tr.warnings.FilterMessageSnippet("UDP hook rejected").All()
	require.Len(t, warned, 1)
	assert.Regexp(t, `^line [12]: `, warned[0].ContextMap()["error"])
}

// Datagrams read together go to the pipeline as one batch; every event
// arrives once, in order within its session, whatever the grouping.
func TestUDPBurst(t *testing.T) {
	tr := startReceiver(t, new(consumertest.LogsSink), func(c *Config) { c.Hooks.HTTP = configoptional.None[HTTPConfig]() })
	var want []string
	// Bursts of 20 datagrams sent back to back (16 KB, well within a
	// default socket receive buffer, so none is dropped before it is read).
	for burst := range 5 {
		var datagrams []string
		for d := range 20 {
			var lines []string
			for i := range 10 {
				n := (burst*20+d)*10 + i
				ev := tokenevent.Event{
					Kind: tokenevent.KindToken, SessionID: fmt.Sprintf("s-%d", n%3),
					TimeUnixNano: uint64(1_700_000_000_000_000_000 + n*1000), Count: 1,
				}
				lines = append(lines, strings.TrimSpace(string(tokenevent.AppendJSON(nil, &ev))))
			}
			datagrams = append(datagrams, strings.Join(lines, "\n"))
			want = append(want, lines...)
		}
		sendUDP(t, tr.udp, datagrams...)
		require.Eventually(t, func() bool {
			return counter(t, tr.tel, "otelcol_receiver_token_stream_accepted_events", "udp") == int64(len(want))
		}, 10*time.Second, 5*time.Millisecond)
	}
	bySession := func(lines []string) map[string][]string {
		m := map[string][]string{}
		p := tokenparse.NewParser(tokenevent.Limits{})
		var ev tokenevent.Event
		for _, l := range lines {
			require.NoError(t, p.Parse([]byte(l), &ev))
			m[ev.SessionID] = append(m[ev.SessionID], l)
		}
		return m
	}
	assert.Equal(t, bySession(want), bySession(events(t, tr.sink)))
}

// Within hooks::udp::batch_window the datagrams go to the pipeline together,
// a session's tokens packed into one record across them; with 0, only
// those one read takes (already queued) do, so a datagram sent after the
// previous one was handed over goes alone.
func TestUDPBatchWindow(t *testing.T) {
	for _, tc := range []struct {
		window         time.Duration
		calls, records int
	}{
		{window: maxBatchWindow, calls: 1, records: 1},
		{window: 0, calls: 2, records: 2},
	} {
		t.Run(tc.window.String(), func(t *testing.T) {
			sink := new(consumertest.LogsSink)
			tr := startReceiver(t, sink, func(c *Config) {
				c.Hooks.HTTP = configoptional.None[HTTPConfig]()
				c.Hooks.UDP.Get().BatchWindow = tc.window
			})
			sendUDP(t, tr.udp, tok1)
			if tc.window == 0 {
				require.Eventually(t, func() bool { return sink.LogRecordCount() == 1 }, 10*time.Second, time.Millisecond)
			}
			sendUDP(t, tr.udp, tok2)
			require.Eventually(t, func() bool { return sink.LogRecordCount() == tc.records }, 10*time.Second, 5*time.Millisecond)
			assert.Len(t, sink.AllLogs(), tc.calls)
			assert.Equal(t, []string{tok1, tok2}, events(t, sink))
		})
	}
}

func TestUDPRefusedKeepsListening(t *testing.T) {
	tr := startReceiver(t, consumertest.NewErr(errors.New("refused")), func(c *Config) { c.Hooks.HTTP = configoptional.None[HTTPConfig]() })
	sendUDP(t, tr.udp, tok1, tok2)
	require.Eventually(t, func() bool {
		return counter(t, tr.tel, "otelcol_receiver_token_stream_refused_events", "udp") == 2
	}, 10*time.Second, 5*time.Millisecond)
}

// The receiver must not keep references to the records it handed on: a
// consumer may keep and mutate them while the next batch is decoded.
func TestRecordsNotReused(t *testing.T) {
	var kept []plog.Logs
	next, err := consumer.NewLogs(func(_ context.Context, ld plog.Logs) error {
		kept = append(kept, ld)
		return nil
	})
	require.NoError(t, err)
	tr := startReceiver(t, next, nil)
	for range 3 {
		status, _, _ := post(t, tr.url, "application/x-ndjson", tok1)
		require.Equal(t, http.StatusOK, status)
	}
	require.Len(t, kept, 3)
	for _, ld := range kept {
		assert.Equal(t, 1, ld.LogRecordCount())
	}
	assert.NotSame(t, &kept[0], &kept[1])
}

var (
	_ receiver.Logs       = (*tokenStreamReceiver)(nil)
	_ component.Component = (*tokenStreamReceiver)(nil)
)

// signalCore is a logger core as the collector gives a component: it names
// the signal of the pipeline the component was created for, and drops it on
// request.
type signalCore struct {
	zapcore.Core
	base zapcore.Core
}

func (c signalCore) DropInjectedAttributes(...string) zapcore.Core { return c.base }

// The receiver is created for its metrics pipeline first, with settings that
// say metrics: its hooks log as logs all the same, its scraper as metrics.
func TestSourcesLogTheirSignal(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	set := receivertest.NewNopSettings(metadata.Type)
	set.Logger = zap.New(signalCore{Core: core.With([]zap.Field{zap.String("otelcol.signal", "metrics")}), base: core})
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	cfg.VLLM.GetOrInsertDefault().Targets = []string{"http://127.0.0.1:1/metrics"}
	f := NewFactory()
	mr, err := f.CreateMetrics(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	_, err = f.CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.NoError(t, mr.Start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, mr.Shutdown(context.Background())) })

	signals := func(msg string) []any {
		var out []any
		for _, e := range logs.FilterMessage(msg).All() {
			for _, f := range e.Context {
				if f.Key == "otelcol.signal" {
					out = append(out, f.String)
				}
			}
		}
		return out
	}
	assert.Equal(t, []any{"logs"}, signals("Token event hook listening"))
	require.Eventually(t, func() bool { return len(signals("vllm scrape failed")) > 0 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, []any{"metrics"}, signals("vllm scrape failed"))
}

// abusiveBody is 8 MiB of "1\n": 4 Mi lines, every one invalid.
func abusiveBody() []byte { return bytes.Repeat([]byte("1\n"), 4<<20) }

// TestHooksHTTPAbusiveBodyBounded: a body of millions of lines past
// max_lines_per_batch, plain or gzipped (a few kilobytes on the wire), is
// cut at the limit with one error for the rest: the answer stays small and
// says so, and every line is still counted as rejected.
func TestHooksHTTPAbusiveBodyBounded(t *testing.T) {
	body := abusiveBody()
	const lines = 4 << 20
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(body)
	require.NoError(t, zw.Close())
	tr := startReceiver(t, new(consumertest.LogsSink), func(c *Config) {
		h := c.Hooks.HTTP.Get()
		h.ServerConfig.MaxRequestBodySize = int64(len(body))
	})
	maxLines := tr.r.cfg.Hooks.Limits.MaxLinesPerBatch
	for name, gzipped := range map[string]bool{"plain": false, "gzip": true} {
		t.Run(name, func(t *testing.T) {
			payload := body
			if gzipped {
				payload = gz.Bytes()
			}
			req, err := http.NewRequest(http.MethodPost, tr.url, bytes.NewReader(payload))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-ndjson")
			if gzipped {
				req.Header.Set("Content-Encoding", "gzip")
			}
			start := time.Now()
			status, _, resp := do(t, req)
			t.Logf("%s: %d bytes on the wire, answered in %s", name, len(payload), time.Since(start))
			assert.Equal(t, http.StatusBadRequest, status)
			assert.Zero(t, resp.Accepted)
			assert.Equal(t, lines, resp.Rejected, "every line counted")
			assert.LessOrEqual(t, len(resp.Errors), lineErrorsKept+1, "error entries bounded")
			last := resp.Errors[len(resp.Errors)-1]
			assert.Equal(t, maxLines+1, last.Line)
			assert.Equal(t, fmt.Sprintf("batch holds more than %d lines: this line and the %d after it not read", maxLines, lines-maxLines-1), last.Message)
		})
	}
	m, err := tr.tel.GetMetric("otelcol_receiver_token_stream_truncated_batches")
	require.NoError(t, err)
	assert.Equal(t, int64(2), m.Data.(metricdata.Sum[int64]).DataPoints[0].Value)
}

// BenchmarkHooksHTTPAbusiveBody is the cost of one 8 MiB body of "1\n"
// through the hook handler (no network, no gzip).
func BenchmarkHooksHTTPAbusiveBody(b *testing.B) {
	body := abusiveBody()
	cfg := createDefaultConfig().(*Config)
	h := cfg.Hooks.HTTP.GetOrInsertDefault()
	h.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	set := receivertest.NewNopSettings(metadata.Type)
	rcv, err := NewFactory().CreateLogs(context.Background(), set, cfg, consumertest.NewNop())
	require.NoError(b, err)
	require.NoError(b, rcv.Start(context.Background(), componenttest.NewNopHost()))
	b.Cleanup(func() { require.NoError(b, rcv.Shutdown(context.Background())) })
	srv := rcv.(*tokenStreamReceiver).http
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		req := httptest.NewRequest(http.MethodPost, h.Path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/x-ndjson")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		if w.Code != http.StatusBadRequest {
			b.Fatalf("status %d", w.Code)
		}
	}
}

// gateConsumer blocks every ConsumeLogs until open is closed.
type gateConsumer struct {
	consumertest.LogsSink
	open chan struct{}
}

func (g *gateConsumer) ConsumeLogs(ctx context.Context, ld plog.Logs) error {
	<-g.open
	return g.LogsSink.ConsumeLogs(ctx, ld)
}

// holdingConsumer holds its first hand-over (logs or metrics) until
// released or its context ends, and records which it was.
type holdingConsumer struct {
	calls     atomic.Int32
	entered   chan struct{}
	release   chan struct{}
	cancelled atomic.Bool
}

func newHoldingConsumer() *holdingConsumer {
	return &holdingConsumer{entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdingConsumer) Capabilities() consumer.Capabilities { return consumer.Capabilities{} }

func (h *holdingConsumer) ConsumeLogs(ctx context.Context, _ plog.Logs) error { return h.hold(ctx) }

func (h *holdingConsumer) ConsumeMetrics(ctx context.Context, _ pmetric.Metrics) error {
	return h.hold(ctx)
}

func (h *holdingConsumer) hold(ctx context.Context) error {
	if h.calls.Add(1) > 1 {
		return nil
	}
	close(h.entered)
	select {
	case <-ctx.Done():
		h.cancelled.Store(true)
		return ctx.Err()
	case <-h.release:
		return nil
	}
}

// assertShutdownDelivers shuts rcv down while its first hand-over is held:
// Shutdown must wait for it, and must not cancel it.
func (h *holdingConsumer) assertShutdownDelivers(t *testing.T, rcv component.Component) {
	t.Helper()
	<-h.entered
	stopped := make(chan error, 1)
	go func() { stopped <- rcv.Shutdown(context.Background()) }()
	// Shutdown cancels its loops first thing; a hand-over tied to them ends
	// within this second. One that is not waits for release.
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) before the hand-over in flight was delivered", err)
	case <-time.After(time.Second):
	}
	close(h.release)
	require.NoError(t, <-stopped)
	assert.False(t, h.cancelled.Load(), "the hand-over's context was cancelled by Shutdown")
}

// TestUDPShutdownDeliversBatchInFlight: datagrams read before shutdown are
// delivered, not cancelled with the read loop.
func TestUDPShutdownDeliversBatchInFlight(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.UDP.GetOrInsertDefault().Endpoint = "127.0.0.1:0"
	hold := newHoldingConsumer()
	rcv, err := NewFactory().CreateLogs(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, hold)
	require.NoError(t, err)
	require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
	sendUDP(t, rcv.(*tokenStreamReceiver).udp.conn.LocalAddr().String(), startLine)
	hold.assertShutdownDelivers(t, rcv)
}

// TestUDPKernelDropsCounted: datagrams the kernel drops while the listener
// is held up by a blocked pipeline (its receive buffer full) are counted,
// read from the socket (SO_RXQ_OVFL).
func TestUDPKernelDropsCounted(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the kernel's drop count is read on Linux only")
	}
	gate := &gateConsumer{open: make(chan struct{})}
	opened := false
	release := func() {
		if !opened {
			opened = true
			close(gate.open)
		}
	}
	tr := startReceiver(t, gate, func(c *Config) {
		c.Hooks.HTTP = configoptional.None[HTTPConfig]()
		c.Hooks.UDP.Get().SocketBufferSize = 4096
	})
	t.Cleanup(release) // before the receiver's shutdown, registered earlier
	conn, err := net.Dial("udp", tr.udp)
	require.NoError(t, err)
	defer conn.Close()
	line := []byte(tok1 + "\n" + strings.Repeat(" ", 900) + "\n")
	// The first datagram takes the listener into the blocked pipeline; the
	// rest overflow the receive buffer.
	_, err = conn.Write(line)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	for range 300 {
		_, err = conn.Write(line)
		require.NoError(t, err)
	}
	release()
	dropped := func() int64 {
		m, err := tr.tel.GetMetric("otelcol_receiver_token_stream_udp_dropped_datagrams")
		if err != nil {
			return 0
		}
		return m.Data.(metricdata.Sum[int64]).DataPoints[0].Value
	}
	// The count rides on the datagrams queued after the drops.
	require.Eventually(t, func() bool {
		_, _ = conn.Write(line)
		return dropped() > 0
	}, 10*time.Second, 20*time.Millisecond)
	accepted := int64(len(gate.AllLogs()))
	t.Logf("dropped %d of 301 datagrams, %d batches accepted", dropped(), accepted)
	assert.LessOrEqual(t, dropped(), int64(300))
}
