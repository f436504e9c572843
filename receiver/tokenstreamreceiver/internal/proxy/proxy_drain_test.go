// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// openStream posts a streaming chat request and returns once the response
// headers and the first event arrived; the rest is read by the caller.
func openStream(t *testing.T, url string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadString('\n') // the first event's data line
	require.NoError(t, err)
	return resp, br
}

// Shutdown with streams in flight: a stream that ends within drain_timeout
// completes as usual; one still running when it is over is cut, its client
// gets an error event and no end of the response, its session ends as
// shutdown and its upstream request is cancelled. Shutdown returns bounded by drain_timeout, and goleak (the
// package's TestMain) checks nothing is left running.
func TestProxyShutdownDrainsThenCutsStreams(t *testing.T) {
	chat, _ := fixtureStreams(t)
	release := make(chan struct{})
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		hang := strings.Contains(r.Header.Get("X-Test"), "hang")
		replay(u, w, r, chat[:2], func(int) time.Duration { return 0 })
		if hang {
			<-r.Context().Done()
			u.mu.Lock()
			u.cancelled++
			u.mu.Unlock()
			return
		}
		<-release
		for _, ev := range chat[2:] {
			_, _ = io.WriteString(w, ev)
		}
	})
	sink := new(consumertest.LogsSink)
	const drain = 1500 * time.Millisecond
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.DrainTimeout = drain })

	open := func(hdr string) (*http.Response, *bufio.Reader) {
		req, err := http.NewRequest(http.MethodPost, tr.proxyURL()+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
		require.NoError(t, err)
		req.Header.Set("X-Test", hdr)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		br := bufio.NewReader(resp.Body)
		_, err = br.ReadString('\n')
		require.NoError(t, err)
		return resp, br
	}
	finishing, finishingBody := open("finish")
	defer finishing.Body.Close()
	hanging, hangingBody := open("hang")
	defer hanging.Body.Close()

	shutdownDone := make(chan error, 1)
	t0 := time.Now()
	go func() { shutdownDone <- tr.shutdown() }()
	close(release) // the finishing stream ends during the drain

	rest, err := io.ReadAll(finishingBody)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "the stream that ends within the drain is whole")
	cut, err := io.ReadAll(hangingBody)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "the cut stream does not end cleanly for its client")
	relayed := "\n" + chat[1] // the first event's blank line (open read its data line), the second event
	require.True(t, strings.HasPrefix(string(cut), relayed), "%q", cut)
	assert.Regexp(t, cutEvent(errShuttingDown, http.StatusServiceUnavailable), strings.TrimPrefix(string(cut), relayed),
		"the events relayed, then an error event saying to retry")

	select {
	case err := <-shutdownDone:
		require.NoError(t, err)
	case <-time.After(drain + 20*time.Second):
		t.Fatal("Shutdown did not return")
	}
	assert.GreaterOrEqual(t, time.Since(t0), drain, "the running stream had its drain_timeout")

	evs := sessionEvents(t, sink, 2)
	var errs []string
	for _, ev := range evs {
		if ev.Kind == tokenevent.KindEnd {
			errs = append(errs, ev.Error)
		}
	}
	assert.ElementsMatch(t, []string{"", tokenevent.ErrorShutdown}, errs)
	// The upstream server sees the cancel when its connection read fails,
	// which may be just after Shutdown returned.
	assert.Eventually(t, func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		return up.cancelled == 1
	}, 10*time.Second, 10*time.Millisecond, "the cut stream's upstream request is cancelled")
	assert.Zero(t, reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_dropped_events", "shutdown"))
	assert.Equal(t, int64(1), reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_cut_streams", "shutdown"))
}

// Events that come after the receiver stopped are counted, not lost
// silently.
func TestProxyEventsAfterShutdownCounted(t *testing.T) {
	up := newScriptedUpstream(t, func(*scriptedUpstream, http.ResponseWriter, *http.Request) {})
	tr := startTestProxy(t, up.URL, new(consumertest.LogsSink))
	require.NoError(t, tr.shutdown())
	// A batcher stopped as the proxy's is at shutdown.
	p := relayOnly(tr.p.sink, 8)
	p.batch.shutdown()
	s := &session{p: p, id: "late"}
	s.token(time.Now())
	s.end(time.Now(), "", "stop")
	assert.Equal(t, int64(2), reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_dropped_events", "shutdown"))
}

// blockingLogs is a pipeline that blocks until released.
type blockingLogs struct {
	consumertest.LogsSink
	entered chan struct{}
	once    sync.Once
	release chan struct{}
}

func (b *blockingLogs) ConsumeLogs(ctx context.Context, ld plog.Logs) error {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	return b.LogsSink.ConsumeLogs(ctx, ld)
}

func (*blockingLogs) Capabilities() consumer.Capabilities { return consumer.Capabilities{} }

// A blocked pipeline: the client still gets every byte, the proxy holds at
// most its queue's bound of events, and every event it could not queue is
// counted; the events accepted and dropped account for all of them.
func TestProxyBlockedPipelineBoundedAndCounted(t *testing.T) {
	chat, _ := fixtureStreams(t)
	const tokens = 400
	events := []string{chat[0]}
	for range tokens / 8 {
		events = append(events, chat[1:9]...)
	}
	events = append(events, "data: [DONE]\n\n")
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, events, func(int) time.Duration { return 0 })
	})
	next := &blockingLogs{entered: make(chan struct{}), release: make(chan struct{})}
	const queue = 16
	tr := startTestProxy(t, up.URL, next, func(c *Config) { c.EventQueueSize = queue })
	released := false
	defer func() {
		if !released {
			close(next.release)
		}
	}()

	// The first stream's start reaches the pipeline, which blocks there.
	resp, got := postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, strings.Join(events, ""), got, "the client's stream is not held back by the pipeline")
	<-next.entered
	// A second whole stream while the pipeline is still blocked.
	_, got = postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Equal(t, strings.Join(events, ""), got)
	assert.LessOrEqual(t, tr.p.batch.queueLen(), queue+queue/4, "the queue is bounded")

	close(next.release)
	released = true
	require.NoError(t, tr.shutdown())

	// Each stream: a start, a token per content chunk, an end.
	var perStream int64 = 2
	for _, ev := range events {
		if strings.Contains(ev, `"content":"`) && !strings.Contains(ev, `"content":""`) {
			perStream++
		}
	}
	dropped := reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_dropped_events", "queue_full")
	assert.Positive(t, dropped, "drops are counted")
	m, err := tr.tel.GetMetric("otelcol_receiver_token_stream_accepted_events")
	require.NoError(t, err)
	var accepted int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		accepted += dp.Value
	}
	assert.Equal(t, 2*perStream, accepted+dropped, "accepted and dropped account for every event")
	// Start and end events have room beyond the token bound: both sessions
	// keep their start and end.
	var starts, ends int
	var ev tokenevent.Event
	for _, ld := range next.AllLogs() {
		for _, rl := range ld.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
						switch e.Kind {
						case tokenevent.KindStart:
							starts++
						case tokenevent.KindEnd:
							ends++
						}
					}))
				}
			}
		}
	}
	assert.Equal(t, 2, starts)
	assert.Equal(t, 2, ends)
}

// proxy::max_streams: beyond it, 503 with a JSON body, no session, counted;
// the slot is free again once a stream ends.
func TestProxyMaxStreams(t *testing.T) {
	chat, _ := fixtureStreams(t)
	release := make(chan struct{})
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat[:2], func(int) time.Duration { return 0 })
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		for _, ev := range chat[2:] {
			_, _ = io.WriteString(w, ev)
		}
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) { c.MaxStreams = 1 })

	first, firstBody := openStream(t, tr.proxyURL())
	defer first.Body.Close()
	resp, body := postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assertOpenAIError(t, resp, body, errTooManyStreams)
	assert.Equal(t, int64(1), reasonCounter(t, tr, "otelcol_receiver_token_stream_proxy_refused_requests", "max_streams"))

	close(release)
	_, err := io.ReadAll(firstBody)
	require.NoError(t, err)
	evs := sessionEvents(t, sink, 1)
	starts := 0
	for _, ev := range evs {
		if ev.Kind == tokenevent.KindStart {
			starts++
		}
	}
	assert.Equal(t, 1, starts, "the refused request has no session")
	require.Eventually(t, func() bool { return tr.p.streams.Load() == 0 }, 5*time.Second, 5*time.Millisecond)
	resp, _ = postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the slot is free once the first stream ended")
}
