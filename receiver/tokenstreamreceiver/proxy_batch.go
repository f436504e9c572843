package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// Token events the proxy observes are gathered from all streams and handed
// to the pipeline together, every eventBatchInterval or eventBatchSize
// events: a pipeline call per chunk would cost more than the chunk. Event
// times are taken when a chunk passes, so batching delays delivery, not
// the figures.
//
// A stream only queues a copy of its event; the log records are written
// when the batch is handed over, by the batcher's goroutine. Writing a
// record per event on the streams' goroutines, between a read and a write
// on two sockets, ran with cold caches and cost several times more.
const (
	eventBatchInterval = 20 * time.Millisecond
	eventBatchSize     = 1000
)

type eventBatcher struct {
	r   *tokenStreamReceiver
	obs *receiverhelper.ObsReport

	mu     sync.Mutex
	queued []tokenevent.Event

	// Only the batcher's goroutine uses these.
	writing []tokenevent.Event
	writer  *tokenrecord.RecordWriter

	kick chan struct{}
	stop chan struct{}
	done sync.WaitGroup
}

func newEventBatcher(r *tokenStreamReceiver, obs *receiverhelper.ObsReport) *eventBatcher {
	b := &eventBatcher{r: r, obs: obs, writer: tokenrecord.NewRecordWriter(), kick: make(chan struct{}, 1), stop: make(chan struct{})}
	b.done.Add(1)
	go b.run()
	return b
}

// add queues a copy of ev; it never blocks on the pipeline. The proxy's
// events carry no attributes, so the copy shares nothing with ev.
func (b *eventBatcher) add(ev *tokenevent.Event) {
	b.mu.Lock()
	b.queued = append(b.queued, *ev)
	full := len(b.queued) >= eventBatchSize
	b.mu.Unlock()
	if full {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

func (b *eventBatcher) run() {
	defer b.done.Done()
	tick := time.NewTicker(eventBatchInterval)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			b.flush()
			return
		case <-tick.C:
			b.flush()
		case <-b.kick:
			b.flush()
		}
	}
}

func (b *eventBatcher) flush() {
	b.mu.Lock()
	events := b.queued
	b.queued = b.writing[:0]
	b.mu.Unlock()
	b.writing = events
	if len(events) == 0 {
		return
	}
	logs := plog.NewLogs()
	sl := logs.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	sl.Scope().SetName(metadata.ScopeName)
	b.writer.Reset(sl.LogRecords(), pcommon.NewTimestampFromTime(time.Now()))
	for i := range events {
		b.writer.Append(&events[i])
	}
	b.writer.Flush()
	ctx := b.obs.StartLogsOp(context.Background())
	n := logs.LogRecordCount()
	err := b.r.next.ConsumeLogs(ctx, logs)
	b.obs.EndLogsOp(ctx, "sse", n, err)
	attrs := transportAttrs[transportProxy]
	if err != nil {
		// The streams went on regardless; only the observation is lost.
		b.r.telemetry.ReceiverTokenStreamRefusedEvents.Add(ctx, int64(len(events)), attrs)
		b.r.logsLogger.Debug("pipeline refused proxy token events", zap.Int("events", len(events)), zap.Error(err))
		return
	}
	b.r.telemetry.ReceiverTokenStreamAcceptedEvents.Add(ctx, int64(len(events)), attrs)
}

func (b *eventBatcher) shutdown() {
	close(b.stop)
	b.done.Wait()
}
