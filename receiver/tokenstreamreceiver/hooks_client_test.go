package tokenstreamreceiver

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenhook"
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
