// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
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
