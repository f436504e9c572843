// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenhook"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// pausedPipeline holds every hand-over until resumed, and says when the
// first one arrived: a collector that stopped while a hook's request was
// under way.
type pausedPipeline struct {
	consumertest.LogsSink
	entered     chan struct{}
	enteredOnce sync.Once
	open        chan struct{}
	openOnce    sync.Once
}

func newPausedPipeline() *pausedPipeline {
	return &pausedPipeline{entered: make(chan struct{}), open: make(chan struct{})}
}

func (p *pausedPipeline) ConsumeLogs(ctx context.Context, ld plog.Logs) error {
	p.enteredOnce.Do(func() { close(p.entered) })
	<-p.open
	return p.LogsSink.ConsumeLogs(ctx, ld)
}

func (p *pausedPipeline) resume() { p.openOnce.Do(func() { close(p.open) }) }

// tokens counts the token events the pipeline got, packed or not.
func (p *pausedPipeline) tokens(t *testing.T) int {
	t.Helper()
	n := 0
	var ev tokenevent.Event
	for _, ld := range p.AllLogs() {
		for _, rl := range ld.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
						if e.Kind == tokenevent.KindToken {
							n++
						}
					}))
				}
			}
		}
	}
	return n
}

// TestHookClientBacklogAfterPause: the Go hook client (pkg/tokenhook), with
// its defaults, against this receiver's HTTP hook with its defaults. The
// pipeline pauses while a backlog of several batches' worth of token events
// queues up in the client; once it resumes, every event the client took is
// accounted for and none is rejected, since the client keeps each batch
// within max_lines_per_batch (a batch of 1 MiB holds about 14 000 token
// lines).
func TestHookClientBacklogAfterPause(t *testing.T) {
	pipe := newPausedPipeline()
	tr := startReceiver(t, pipe, nil)
	t.Cleanup(pipe.resume) // before the receiver's Shutdown, which waits for the held request
	maxLines := tr.r.cfg.Hooks.Limits.MaxLinesPerBatch

	c, err := tokenhook.New(tokenhook.Config{Endpoint: tr.url, Timeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	require.NoError(t, c.Token("first", time.Time{}, 1))
	select {
	case <-pipe.entered:
	case <-time.After(time.Minute):
		t.Fatal("the first batch never reached the pipeline")
	}

	// The client's sender is held in its first request: everything below
	// queues (the default queue holds 65 536).
	backlog := 4*maxLines + maxLines/2
	sessions := make([]string, 64)
	for i := range sessions {
		sessions[i] = fmt.Sprintf("session-%02d", i)
	}
	for i := range backlog {
		require.NoError(t, c.Token(sessions[i%len(sessions)], time.Time{}, 1))
	}
	taken := uint64(1 + backlog)

	pipe.resume()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, c.Close(ctx))
	st := c.Stats()
	assert.Zero(t, st.Rejected, "events rejected: %+v", st)
	assert.Equal(t, taken, st.Sent+st.Dropped+st.Failed+st.Rejected, "every event taken counts once: %+v", st)
	assert.Equal(t, tokenhook.Stats{Sent: taken}, st, "the queue held the backlog and the receiver took it")
	assert.Equal(t, int(taken), pipe.tokens(t))
	assert.Zero(t, counter(t, tr.tel, "otelcol_receiver_token_stream_rejected_events", "http"))
	assert.Zero(t, counter(t, tr.tel, "otelcol_receiver_token_stream_truncated_batches", "http"))
}

// The Go hook client over the Unix socket against this receiver: every
// event taken is sent (acknowledged), and a line the receiver rejects is
// counted rejected, as the acknowledgement says.
func TestHookClientUnix(t *testing.T) {
	path := socketPath(t)
	tr := startReceiver(t, new(consumertest.LogsSink), func(c *Config) {
		c.Hooks.HTTP = configoptional.None[HTTPConfig]()
		c.Hooks.UDP = configoptional.None[UDPConfig]()
		c.Hooks.Unix.GetOrInsertDefault().Endpoint = path
		c.Hooks.Limits.MaxAttributes = 2
	})
	c, err := tokenhook.New(tokenhook.Config{Endpoint: "unix://" + path, FlushInterval: time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, c.Start(tokenhook.Start{SessionID: "u-1", Model: "m"}))
	for range 1000 {
		require.NoError(t, c.Token("u-1", time.Time{}, 1))
	}
	// The receiver's limit is lower than the client's: the line is
	// written, and rejected.
	require.NoError(t, c.Start(tokenhook.Start{SessionID: "u-2", Attributes: map[string]string{"a": "1", "b": "2", "c": "3"}}))
	require.NoError(t, c.End(tokenhook.End{SessionID: "u-1"}))
	require.NoError(t, c.Close(context.Background()))
	assert.Equal(t, tokenhook.Stats{Sent: 1002, Rejected: 1}, c.Stats())
	assert.Equal(t, int64(1002), counter(t, tr.tel, "otelcol_receiver_token_stream_accepted_events", "unix"))
	assert.Equal(t, int64(1), counter(t, tr.tel, "otelcol_receiver_token_stream_rejected_events", "unix"))
}

// A collector restart under a streaming client: the lines written before
// the restart are either acknowledged (sent) or counted failed, the
// batches while no collector listens fail at once, and once the collector
// listens again the client reconnects by itself. Every event taken counts
// once, and the receivers got exactly those counted sent.
func TestHookClientUnixRestart(t *testing.T) {
	path := socketPath(t)
	cfg := createDefaultConfig().(*Config)
	cfg.Hooks.HTTP = configoptional.None[HTTPConfig]()
	cfg.Hooks.UDP = configoptional.None[UDPConfig]()
	cfg.Hooks.Unix.GetOrInsertDefault().Endpoint = path
	start := func(sink *consumertest.LogsSink) *tokenStreamReceiver {
		rcv, err := NewFactory().CreateLogs(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, sink)
		require.NoError(t, err)
		require.NoError(t, rcv.Start(context.Background(), componenttest.NewNopHost()))
		return rcv.(*tokenStreamReceiver)
	}
	tokensIn := func(sinks ...*consumertest.LogsSink) int {
		n := 0
		for _, s := range sinks {
			for _, e := range events(t, s) {
				n += strings.Count(e, `"event":"token"`)
			}
		}
		return n
	}
	sink1, sink2 := new(consumertest.LogsSink), new(consumertest.LogsSink)
	r1 := start(sink1)
	c, err := tokenhook.New(tokenhook.Config{Endpoint: "unix://" + path, FlushInterval: time.Millisecond})
	require.NoError(t, err)
	taken := uint64(0)
	token := func() {
		if c.Token("restart-1", time.Time{}, 1) == nil {
			taken++
		}
	}
	for range 500 {
		token()
	}
	require.Eventually(t, func() bool { return c.Stats().Sent > 0 }, 10*time.Second, time.Millisecond)
	// Stop while the client writes.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		assert.NoError(t, r1.Shutdown(context.Background()))
	}()
	for range 500 {
		token()
	}
	<-stopped
	// No collector: batches fail.
	for range 100 {
		token()
	}
	require.Eventually(t, func() bool { return c.Stats().Failed > 0 }, 10*time.Second, time.Millisecond)
	r2 := start(sink2)
	defer func() { require.NoError(t, r2.Shutdown(context.Background())) }()
	// The client reconnects (within its backoff, at most 5 s).
	before := c.Stats().Sent
	require.Eventually(t, func() bool {
		token()
		return c.Stats().Sent > before && tokensIn(sink2) > 0
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, c.Close(context.Background()))
	st := c.Stats()
	t.Logf("taken %d: %+v", taken, st)
	assert.Equal(t, taken, st.Sent+st.Dropped+st.Failed+st.Rejected, "every event taken counts once: %+v", st)
	assert.Equal(t, int(st.Sent), tokensIn(sink1, sink2), "sent means the receivers took it")
	assert.NotZero(t, st.Failed)
}
