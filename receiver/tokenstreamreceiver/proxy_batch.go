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
)

// Token events the proxy observes are gathered from all streams and handed
// to the pipeline together, every eventBatchInterval or eventBatchSize
// events: a pipeline call per chunk would cost more than the chunk. Event
// times are taken when a chunk passes, so batching delays delivery, not
// the figures.
const (
	eventBatchInterval = 20 * time.Millisecond
	eventBatchSize     = 1000
)

type eventBatcher struct {
	r   *tokenStreamReceiver
	obs *receiverhelper.ObsReport

	mu     sync.Mutex
	logs   plog.Logs
	writer *tokenevent.RecordWriter
	events int

	kick chan struct{}
	stop chan struct{}
	done sync.WaitGroup
}

func newEventBatcher(r *tokenStreamReceiver, obs *receiverhelper.ObsReport) *eventBatcher {
	b := &eventBatcher{r: r, obs: obs, writer: tokenevent.NewRecordWriter(), kick: make(chan struct{}, 1), stop: make(chan struct{})}
	b.reset()
	b.done.Add(1)
	go b.run()
	return b
}

// reset starts a new batch. Call with mu held (or before the batcher runs).
func (b *eventBatcher) reset() {
	b.logs = plog.NewLogs()
	sl := b.logs.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	sl.Scope().SetName(scopeName)
	b.writer.Reset(sl.LogRecords(), pcommon.NewTimestampFromTime(time.Now()))
	b.events = 0
}

// add queues one event; it never blocks on the pipeline.
func (b *eventBatcher) add(ev *tokenevent.Event) {
	b.mu.Lock()
	b.writer.Append(ev)
	b.events++
	full := b.events >= eventBatchSize
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
	logs, events := b.logs, b.events
	b.reset()
	b.mu.Unlock()
	if events == 0 {
		return
	}
	ctx := b.obs.StartLogsOp(context.Background())
	n := logs.LogRecordCount()
	err := b.r.next.ConsumeLogs(ctx, logs)
	b.obs.EndLogsOp(ctx, "sse", n, err)
	attrs := b.r.telemetry.attrs[transportProxy]
	if err != nil {
		// The streams went on regardless; only the observation is lost.
		b.r.telemetry.refused.Add(ctx, int64(events), attrs)
		b.r.settings.Logger.Debug("pipeline refused proxy token events", zap.Int("events", events), zap.Error(err))
		return
	}
	b.r.telemetry.accepted.Add(ctx, int64(events), attrs)
}

func (b *eventBatcher) shutdown() {
	close(b.stop)
	b.done.Wait()
}
