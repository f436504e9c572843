// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadatatest"
)

// batchRecord is a logs batch of one batch token record stamped at with
// the AttrTokenSessions string sessions.
func batchRecord(at int64, sessions string) plog.Logs {
	ld := plog.NewLogs()
	lr := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	lr.SetEventName(tokenrecord.EventNameToken)
	lr.SetTimestamp(pcommon.Timestamp(at))
	lr.Attributes().PutStr(tokenrecord.AttrTokenSessions, sessions)
	return ld
}

// A batch token record loses what it cannot read and no more: a session's
// malformed entry drops that session's tokens there and counts as one
// invalid record, the batch's other sessions fold; where its frame breaks
// (where the next entry begins is unknown) the rest is dropped, counted
// once.
func TestBatchRecordInvalidParts(t *testing.T) {
	for _, tt := range []struct {
		name     string
		sessions string
		want     map[string]int64 // output tokens by session
	}{
		{"a malformed entry", "1 a 0\n1 b 5 x\n1 c 10:2", map[string]int64{"a": 1, "b": 0, "c": 2}},
		{"a session ID beyond the limit", "1 a 0\n300 " + string(make([]byte, 300)) + " 5\n1 c 10:2", map[string]int64{"a": 1, "b": 0, "c": 2}},
		{"a broken frame", "1 a 0\n9 b 5\n1 c 10:2", map[string]int64{"a": 1, "b": 0, "c": 0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tel := componenttest.NewTelemetry()
			defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
			p := newPipelinesWith(t, metadatatest.NewSettings(tel), func(c *Config) { c.Sampling.NormalPercent = 100 })
			ctx := context.Background()
			require.NoError(t, p.logs.ConsumeLogs(ctx, events(start("a", traceSlow, base), start("b", traceFast, base), start("c", traceFast, base))))
			require.NoError(t, p.logs.ConsumeLogs(ctx, batchRecord(base+100*ms, tt.sessions)))
			require.NoError(t, p.logs.ConsumeLogs(ctx, events(end("a", base+200*ms), end("b", base+200*ms), end("c", base+200*ms))))
			p.shutdown(t)

			got := map[string]int64{}
			for _, lr := range recordsNamed(p.logSink.AllLogs(), eventNameSummary) {
				a := lr.Attributes().AsRaw()
				n, _ := a["gen_ai.usage.output_tokens"].(int64)
				got[a["llm.session.id"].(string)] = n
			}
			assert.Equal(t, tt.want, got)
			m, err := tel.GetMetric("otelcol_processor_token_session_invalid_records")
			require.NoError(t, err)
			assert.Equal(t, int64(1), m.Data.(metricdata.Sum[int64]).DataPoints[0].Value)
		})
	}
}

// batchWorkload is hook traffic cut into batches as a hook flushing on size
// sends them: 24 sessions on two engines and three tenants, a new one every
// 50 ms, each a start, 6 to 12 tokens 20 ms apart (the first 100 to 300 ms
// after the start), an end; batches of 37 events, so that each holds the
// tokens of several sessions among other sessions' starts and ends.
func batchWorkload() [][]tokenevent.Event {
	var evs []tokenevent.Event
	for i := range 24 {
		id := fmt.Sprintf("w-%02d", i)
		at := base + int64(i)*50*ms
		st := start(id, pcommon.TraceID{0xdd, byte(i + 1)}, at)
		st.Engine = fmt.Sprint("vllm-", i%2)
		st.PromptTokens = int64(100 + i*37)
		st.Attributes = []tokenevent.Attribute{{Key: "tenant.id", Value: fmt.Sprint("t", i%3)}}
		evs = append(evs, st)
		t := at + int64(100+(i*53)%200)*ms + int64(i)*1000
		for k := range 6 + i%7 {
			evs = append(evs, tok(id, t+int64(k)*20*ms, int64(1+k%2)))
		}
		evs = append(evs, end(id, t+int64(6+i%7)*20*ms))
	}
	slices.SortStableFunc(evs, func(a, b tokenevent.Event) int { return int(int64(a.TimeUnixNano) - int64(b.TimeUnixNano)) })
	var batches [][]tokenevent.Event
	for len(evs) > 0 {
		n := min(37, len(evs))
		batches = append(batches, evs[:n])
		evs = evs[n:]
	}
	return batches
}

// eventRecords builds a logs batch of evs with a record per event, in the
// order they came: what the fold is compared with.
func eventRecords(evs ...tokenevent.Event) plog.Logs {
	ld := plog.NewLogs()
	w := tokenrecord.NewRecordWriter()
	w.Reset(ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords(), 1)
	for i := range evs {
		w.Append(&evs[i])
		w.Flush()
	}
	return ld
}

// What token_session reports of a workload is the same whether its token
// events come packed as the receiver writes them (batch records among
// records of one session's run) or a record per event in the order they
// came: the summaries, with each session's share of its engine's time and
// energy, which depend on where each session's first token is folded among
// the other sessions' starts and ends, and the engine time counters.
func TestBatchRecordsFoldAsEventRecords(t *testing.T) {
	fold := func(t *testing.T, packed bool) (map[string]map[string]any, map[string]float64) {
		p := newPipelines(t, func(c *Config) { c.Sampling.NormalPercent = 100 })
		ctx := context.Background()
		for _, pod := range []string{"vllm-0", "vllm-1"} {
			require.NoError(t, p.metrics.ConsumeMetrics(ctx, dcgmPower(pod, base, 200)))
		}
		batchRecords := 0
		for _, b := range batchWorkload() {
			ld := eventRecords(b...)
			if packed {
				ld = events(b...)
				for _, lr := range ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().All() {
					if tokenrecord.IsTokenBatch(lr) {
						batchRecords++
					}
				}
			}
			require.NoError(t, p.logs.ConsumeLogs(ctx, ld))
		}
		if packed {
			require.Positive(t, batchRecords, "the workload makes batch records")
		}
		p.shutdown(t)
		summaries := map[string]map[string]any{}
		for _, lr := range recordsNamed(p.logSink.AllLogs(), eventNameSummary) {
			a := lr.Attributes().AsRaw()
			summaries[a["llm.session.id"].(string)] = a
		}
		counters := engineCounters(t, p, "llm.engine.time")
		for k := range counters {
			if k == "/idle" { // up to the collector's clock at shutdown
				delete(counters, k)
			}
		}
		return summaries, counters
	}
	var packedSummaries, eventSummaries map[string]map[string]any
	var packedCounters, eventCounters map[string]float64
	t.Run("packed", func(t *testing.T) { packedSummaries, packedCounters = fold(t, true) })
	t.Run("a record per event", func(t *testing.T) { eventSummaries, eventCounters = fold(t, false) })
	require.Len(t, eventSummaries, 24)
	assert.Equal(t, eventSummaries, packedSummaries)
	assert.Equal(t, eventCounters, packedCounters)
}
