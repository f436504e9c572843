// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package e2e tests the built distribution, ./bin/otelcol-llm, as a user
// runs it: a real process with a YAML config, fed by the hook clients, with
// its output checked in an OTLP sink and on the debug exporter's stdout.
//
// The binary's path comes from OTELCOL_LLM_BIN (make test sets it; see
// internal/harness/testbin). Without it the tests skip, except under CI,
// where a missing binary is a failure.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/llamacpp"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/otlpsink"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenhook"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		llamacpp.Cleanup()
		os.Exit(code)
	}))
}

// sink is the OTLP/gRPC backend the collector exports to: it keeps what it
// receives.
type sink struct{ *otlpsink.Sink }

// session returns the token events of one session received so far, as
// wire lines; a record that is not a valid token event fails the test.
func (s *sink) session(t *testing.T, id string) []string {
	var out []string
	var ev tokenevent.Event
	for _, lr := range s.LogRecords() {
		if !tokenrecord.IsTokenEvent(lr) {
			continue
		}
		require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
			if e.SessionID == id {
				out = append(out, strings.TrimSpace(string(tokenevent.AppendJSON(nil, e))))
			}
		}))
	}
	return out
}

func startSink(t *testing.T) (*sink, string) {
	t.Helper()
	s, err := otlpsink.Start("127.0.0.1:0", otlpsink.Options{Keep: true})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return &sink{s}, s.Addr()
}

// freePort returns a loopback address free at the time of the call (see
// process.FreeAddr: drawn below the kernel's ephemeral ports, so that no
// other process's connection takes it before the collector listens).
func freePort(t *testing.T, network string) string {
	t.Helper()
	addr, err := process.FreeAddr()
	if network == "udp" {
		addr, err = process.FreeUDPAddr()
	}
	require.NoError(t, err)
	return addr
}

// collector is the distribution on free loopback ports.
type collector struct {
	httpAddr, udpAddr, otlpAddr, proxyAddr string
	// liveAddr is token_session's live view, where the config serves it.
	liveAddr string
	*testbin.Process
}

// newCollector picks free loopback ports for the collector's endpoints.
func newCollector(t *testing.T) *collector {
	return &collector{httpAddr: freePort(t, "tcp"), udpAddr: freePort(t, "udp"), otlpAddr: freePort(t, "tcp"), proxyAddr: freePort(t, "tcp")}
}

// startCollector runs the distribution with testdata/<config>, its
// endpoints on free loopback ports and its exporter pointed at sinkAddr. It
// stops the process (SIGTERM) when the test ends, or at c.Stop, and checks
// that it exits cleanly.
func startCollector(t *testing.T, config, sinkAddr string, env ...string) *collector {
	t.Helper()
	c := newCollector(t)
	env = append([]string{
		"HOOKS_HTTP_ENDPOINT=" + c.httpAddr, "HOOKS_UDP_ENDPOINT=" + c.udpAddr,
		"OTLP_ENDPOINT=" + c.otlpAddr, "PROXY_ENDPOINT=" + c.proxyAddr, "SINK_ENDPOINT=" + sinkAddr,
	}, env...)
	c.Process = testbin.StartCollector(t, []string{"--config", filepath.Join("testdata", config)}, env)
	return c
}

// session returns the wire lines of one complete session with the given ID.
func session(id string, base uint64) []string {
	evs := []tokenevent.Event{
		{
			Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: base, Model: "meta-llama/Llama-3.1-8B-Instruct",
			Operation: tokenevent.OperationChat, PromptTokens: 812, Engine: "vllm-0",
			TraceID:    [16]byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
			Attributes: []tokenevent.Attribute{{Key: "quantization", Value: "fp8"}}, Count: 1, CompletionTokens: -1,
		},
		{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: base + 180_000_000, Count: 1, PromptTokens: -1, CompletionTokens: -1},
		{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: base + 205_000_000, Count: 2, PromptTokens: -1, CompletionTokens: -1},
		{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: base + 231_000_000, Count: 1, PromptTokens: -1, CompletionTokens: -1},
		{Kind: tokenevent.KindEnd, SessionID: id, TimeUnixNano: base + 232_000_000, CompletionTokens: 4, FinishReason: "stop", PromptTokens: -1, Count: 1},
	}
	lines := make([]string, len(evs))
	for i := range evs {
		lines[i] = strings.TrimSpace(string(tokenevent.AppendJSON(nil, &evs[i])))
	}
	return lines
}

func waitForSession(t *testing.T, s *sink, id string, want []string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(s.session(t, id)) >= len(want) }, 30*time.Second, 10*time.Millisecond,
		"session %s never arrived complete; got %v", id, s.session(t, id))
	assert.Equal(t, want, s.session(t, id), "session %s", id)
}

func TestHooksEndToEnd(t *testing.T) {
	sink, sinkAddr := startSink(t)
	col := startCollector(t, "hooks.yaml", sinkAddr)
	base := uint64(time.Now().UnixNano())

	t.Run("http", func(t *testing.T) {
		want := session("http-1", base)
		resp, err := http.Post("http://"+col.httpAddr+"/v1/token-events", "application/x-ndjson", strings.NewReader(strings.Join(want, "\n")))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		waitForSession(t, sink, "http-1", want)
	})

	t.Run("udp", func(t *testing.T) {
		want := session("udp-1", base)
		conn, err := net.Dial("udp", col.udpAddr)
		require.NoError(t, err)
		defer conn.Close()
		// One datagram with the start, then one per event, as a hook would.
		_, err = conn.Write([]byte(want[0] + "\n"))
		require.NoError(t, err)
		for _, l := range want[1:] {
			_, err = conn.Write([]byte(l))
			require.NoError(t, err)
		}
		waitForSession(t, sink, "udp-1", want)
	})

	for _, transport := range []string{"http", "udp"} {
		t.Run("go client "+transport, func(t *testing.T) {
			endpoint := "udp://" + col.udpAddr
			if transport == "http" {
				endpoint = "http://" + col.httpAddr + "/v1/token-events"
			}
			id := "go-" + transport
			sendWithGoClient(t, endpoint, id, base)
			waitForSession(t, sink, id, session(id, base))
		})
		t.Run("python client "+transport, func(t *testing.T) {
			endpoint := "udp://" + col.udpAddr
			if transport == "http" {
				endpoint = "http://" + col.httpAddr + "/v1/token-events"
			}
			id := "py-" + transport
			sendWithPythonClient(t, endpoint, id, base)
			waitForSession(t, sink, id, session(id, base))
		})
	}

	t.Run("debug exporter", func(t *testing.T) {
		out := col.Output.String()
		for _, want := range []string{
			"EventName: llm.session.start", "EventName: llm.token", "EventName: llm.session.end",
			"-> llm.session.id: Str(http-1)", "-> gen_ai.request.model: Str(meta-llama/Llama-3.1-8B-Instruct)",
			"-> llm.token.events: Str(0 25000000:2 51000000)", "Trace ID: 4bf92f3577b34da6a3ce929d0e0e4736",
		} {
			assert.Contains(t, out, want)
		}
	})
}

func TestRejectsBadInputAndKeepsServing(t *testing.T) {
	sink, sinkAddr := startSink(t)
	col := startCollector(t, "hooks.yaml", sinkAddr)
	want := session("after-bad", uint64(time.Now().UnixNano()))

	conn, err := net.Dial("udp", col.udpAddr)
	require.NoError(t, err)
	defer conn.Close()
	for _, junk := range []string{"\x00\x01\x02", "{", `{"event":"token"}`, strings.Repeat("x", 60000)} {
		_, err = conn.Write([]byte(junk))
		require.NoError(t, err)
	}
	resp, err := http.Post("http://"+col.httpAddr+"/v1/token-events", "application/x-ndjson", strings.NewReader("not json\n"+strings.Join(want, "\n")))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	waitForSession(t, sink, "after-bad", want)
}

func sendWithGoClient(t *testing.T, endpoint, id string, base uint64) {
	t.Helper()
	hook, err := tokenhook.New(tokenhook.Config{Endpoint: endpoint})
	require.NoError(t, err)
	at := func(offset uint64) time.Time { return time.Unix(0, int64(base+offset)) }
	require.NoError(t, hook.Start(tokenhook.Start{
		SessionID: id, Time: at(0), Model: "meta-llama/Llama-3.1-8B-Instruct", Operation: tokenhook.OperationChat,
		PromptTokens: 812, HasPromptTokens: true, Engine: "vllm-0",
		TraceID:    [16]byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		Attributes: map[string]string{"quantization": "fp8"},
	}))
	require.NoError(t, hook.Token(id, at(180_000_000), 1))
	require.NoError(t, hook.Token(id, at(205_000_000), 2))
	require.NoError(t, hook.Token(id, at(231_000_000), 1))
	require.NoError(t, hook.End(tokenhook.End{SessionID: id, Time: at(232_000_000), CompletionTokens: 4, HasCompletionTokens: true, FinishReason: "stop"}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, hook.Close(ctx))
	st := hook.Stats()
	assert.Equal(t, uint64(5), st.Sent)
	assert.Zero(t, st.Dropped+st.Failed)
}

const pythonSender = `
import sys
from otelcol_llm_hook import Client
endpoint, sid, base = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Client(endpoint) as c:
    c.start(sid, base, trace_id="4bf92f3577b34da6a3ce929d0e0e4736", model="meta-llama/Llama-3.1-8B-Instruct",
            operation="chat", prompt_tokens=812, engine="vllm-0", attributes={"quantization": "fp8"})
    c.token(sid, base + 180_000_000)
    c.token(sid, base + 205_000_000, count=2)
    c.token(sid, base + 231_000_000)
    c.end(sid, base + 232_000_000, completion_tokens=4, finish_reason="stop")
st = c.stats()
assert st["sent"] == 5 and st["dropped"] == 0 and st["failed"] == 0, st
`

func sendWithPythonClient(t *testing.T, endpoint, id string, base uint64) {
	t.Helper()
	python := testbin.Tool(t, "python3", "python3") // the Python hook client
	cmd := exec.Command(python, "-c", pythonSender, endpoint, id, fmt.Sprint(base))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("..", "..", "..", "hooks", "python"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
}
