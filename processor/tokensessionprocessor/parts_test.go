// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// appLogs is a batch of application logs: no token event records.
func appLogs(n int) plog.Logs {
	ld := plog.NewLogs()
	lrs := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords()
	for i := range n {
		lrs.AppendEmpty().Body().SetStr(fmt.Sprint("request ", i, " served"))
	}
	// An empty scope goes, as it does from a batch that is folded.
	ld.ResourceLogs().At(0).ScopeLogs().AppendEmpty()
	return ld
}

func coreOf(t *testing.T) *core {
	t.Helper()
	c, err := cores.LoadOrStore(component.NewIDWithName(metadata.Type, t.Name()), nil)
	require.NoError(t, err)
	return c.Unwrap()
}

// Application log batches take no lock, and metrics batches only the
// engine context's while no kept session's outputs wait: both pass while
// the sessions' lock is held elsewhere.
func TestLockFreePaths(t *testing.T) {
	p := newPipelines(t, nil)
	defer p.shutdown(t)
	c := coreOf(t)
	ctx := context.Background()

	c.sessions.mu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, p.logs.ConsumeLogs(ctx, appLogs(3)))
		assert.NoError(t, p.metrics.ConsumeMetrics(ctx, engineMetricsAt(base, 0.5, 8, 2, 10)))
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an application log batch or a metrics batch waited for the sessions' lock")
	}
	c.sessions.mu.Unlock()

	require.Len(t, p.logSink.AllLogs(), 1)
	got := p.logSink.AllLogs()[0]
	assert.Equal(t, 3, got.LogRecordCount())
	assert.Equal(t, 1, got.ResourceLogs().At(0).ScopeLogs().Len(), "the empty scope is gone")
	assert.Empty(t, p.logSink.AllLogs()[1:])
	assert.Len(t, p.metSink.AllMetrics(), 1)

	// A batch of nothing but empty scopes goes nowhere, as before.
	empty := plog.NewLogs()
	empty.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	require.NoError(t, p.logs.ConsumeLogs(ctx, empty))
	assert.Len(t, p.logSink.AllLogs(), 1)
}

// Every path at once: token batches, application log batches, metrics
// batches, span batches and ticks from several goroutines; run under -race.
// Kept sessions wait for their engine's scrape, so metrics batches release
// outputs too.
func TestPartsConcurrent(t *testing.T) {
	p := newPipelines(t, func(c *Config) {
		c.Stall.CheckInterval = time.Millisecond
		c.Sampling.NormalPercent = 100
	})
	ctx := context.Background()
	now := time.Now().UnixNano()
	require.NoError(t, p.metrics.ConsumeMetrics(ctx, engineMetricsAt(now, 0.5, 8, 2, 10)))
	const workers, perWorker = 3, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(4)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				id := fmt.Sprintf("w%d-s%d", w, i)
				trace := pcommon.TraceID{byte(w), byte(i), 9}
				at := time.Now().UnixNano()
				evs := []tokenevent.Event{start(id, trace, at), tok(id, at+10*ms, 1), tok(id, at+30*ms, 2), end(id, at+40*ms)}
				assert.NoError(t, p.logs.ConsumeLogs(ctx, events(evs...)))
			}
		}()
		go func() {
			defer wg.Done()
			for range perWorker {
				assert.NoError(t, p.logs.ConsumeLogs(ctx, appLogs(2)))
			}
		}()
		go func() {
			defer wg.Done()
			for range perWorker {
				assert.NoError(t, p.metrics.ConsumeMetrics(ctx, engineMetricsAt(time.Now().UnixNano(), 0.6, 8, 2, 11)))
			}
		}()
		go func() {
			defer wg.Done()
			for i := range perWorker {
				assert.NoError(t, p.traces.ConsumeTraces(ctx, engineSpans(pcommon.TraceID{byte(w), byte(i), 9})))
			}
		}()
	}
	wg.Wait()
	p.shutdown(t)
	var summaries, app int
	for _, ld := range p.logSink.AllLogs() {
		for _, rl := range ld.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					switch {
					case lr.EventName() == eventNameSummary:
						summaries++
					case lr.EventName() == "":
						app++
					}
				}
			}
		}
	}
	assert.Equal(t, workers*perWorker, summaries, "every kept session's summary, once")
	assert.Equal(t, workers*perWorker*2, app, "every application record, once")
}
