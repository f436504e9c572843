// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
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

// The queue is bounded (proxy::event_queue_size): a pipeline that is slow
// or blocked (an exporter's blocking queue) must not grow the proxy's memory
// behind memory_limiter's back. Token events are dropped at the bound;
// start and end events have a quarter more room, since losing one leaves a
// session without its start (orphan tokens) or its end (ended only by the
// idle timeout), where a lost token only thins the session's figures. At
// most two queues' worth is held: one queued, one being handed over.
type eventBatcher struct {
	sink    Sink
	dropped metric.Int64Counter

	mu       sync.Mutex
	queued   []tokenevent.Event
	stopped  bool
	limit    int // token events
	hardCap  int // start and end events
	overflow atomic.Int64

	// Only the batcher's goroutine uses these.
	writing []tokenevent.Event
	writer  *tokenrecord.RecordWriter

	kick chan struct{}
	stop chan struct{}
	done sync.WaitGroup
}

func newEventBatcher(sink Sink, counters Counters, queueSize int) *eventBatcher {
	b := &eventBatcher{
		sink: sink, dropped: counters.DroppedEvents, writer: tokenrecord.NewRecordWriter(), kick: make(chan struct{}, 1), stop: make(chan struct{}),
		limit: queueSize, hardCap: queueSize + queueSize/4,
	}
	b.done.Add(1)
	go b.run()
	return b
}

// add queues a copy of ev; it never blocks on the pipeline. The proxy's
// events carry no attributes, so the copy shares nothing with ev.
func (b *eventBatcher) add(ev *tokenevent.Event) {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		b.dropped.Add(context.Background(), 1, dropShutdown)
		return
	}
	limit := b.limit
	if ev.Kind != tokenevent.KindToken {
		limit = b.hardCap
	}
	if len(b.queued) >= limit {
		b.mu.Unlock()
		// Counted by the batcher's goroutine: a metric call per event
		// under overload would slow the streams further.
		b.overflow.Add(1)
		return
	}
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
	if n := b.overflow.Swap(0); n > 0 {
		b.dropped.Add(context.Background(), n, dropQueueFull)
	}
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
	// The streams went on regardless of the pipeline's answer; the sink
	// counts a refusal, only the observation is lost.
	_ = b.sink.ConsumeEvents(context.Background(), logs, len(events))
}

// shutdown hands over what is queued; the events added after it are
// dropped and counted.
func (b *eventBatcher) shutdown() {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	b.stopped = true
	b.mu.Unlock()
	close(b.stop)
	b.done.Wait()
}

// queueLen is the number of events waiting for the next hand-over.
func (b *eventBatcher) queueLen() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queued)
}

var (
	dropQueueFull = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "queue_full")))
	dropShutdown  = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "shutdown")))
)
