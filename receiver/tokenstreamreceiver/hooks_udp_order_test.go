// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// Datagrams overtake each other. Those read in one batch window are folded
// with each session's events in time order, so an end that overtook the
// session's last token does not make it late.

// orderLines are a session whose end (completion_tokens 3) came before its
// last token: tokens at 100, 120 and 140 ms, so TPOT is 20 ms; folded as
// they came, the last token would be late and TPOT 10 ms.
var orderLines = []string{
	`{"event":"start","session_id":"o-1","time_unix_nano":1700000000000000000,"model":"m","operation":"chat"}`,
	`{"event":"token","session_id":"o-1","time_unix_nano":1700000000100000000}`,
	`{"event":"token","session_id":"o-1","time_unix_nano":1700000000120000000}`,
	`{"event":"end","session_id":"o-1","time_unix_nano":1700000000140000000,"completion_tokens":3,"finish_reason":"stop"}`,
	`{"event":"token","session_id":"o-1","time_unix_nano":1700000000140000000}`,
}

// Through the UDP listener into token_session: the summary's TPOT is the
// truth, and no event was late.
func TestUDPEndOvertakingTheLastToken(t *testing.T) {
	ctx := context.Background()
	pf := tokensessionprocessor.NewFactory()
	pcfg := pf.CreateDefaultConfig().(*tokensessionprocessor.Config)
	pcfg.Sampling.NormalPercent = 100 // every session's summary
	summaries := new(consumertest.LogsSink)
	lp, err := pf.CreateLogs(ctx, processortest.NewNopSettings(pf.Type()), pcfg, summaries)
	require.NoError(t, err)
	require.NoError(t, lp.Start(ctx, componenttest.NewNopHost()))
	defer func() { require.NoError(t, lp.Shutdown(ctx)) }()

	tr := startReceiver(t, lp, func(c *Config) { c.Hooks.HTTP = configoptional.None[HTTPConfig]() })
	// One datagram: the lines of a batch are folded as a window's datagrams
	// are (TestUDPBatchOrderedAcrossDatagrams), and one datagram is never
	// split between windows.
	sendUDP(t, tr.udp, strings.Join(orderLines, "\n"))
	var summary plog.LogRecord
	require.Eventually(t, func() bool {
		for _, ld := range summaries.AllLogs() {
			for _, rl := range ld.ResourceLogs().All() {
				for _, sl := range rl.ScopeLogs().All() {
					for _, lr := range sl.LogRecords().All() {
						if lr.EventName() == tokenrecord.EventNameSummary {
							summary = lr
							return true
						}
					}
				}
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	attrs := summary.Attributes().AsRaw()
	assert.InDelta(t, 0.020, attrs["llm.session.tpot"], 1e-9, "(140-100 ms)/(3-1)")
	assert.Equal(t, int64(3), attrs["llm.session.chunks"], "the last token counted")
	assert.Equal(t, "completed", attrs["llm.session.outcome"])
}

// The datagrams of one window go through one decoder batch: the order is
// put right across them, as within one.
func TestUDPBatchOrderedAcrossDatagrams(t *testing.T) {
	r, err := newTokenStreamReceiver(createDefaultConfig().(*Config), receivertest.NewNopSettings(metadata.Type), consumertest.NewNop())
	require.NoError(t, err)
	for _, ordered := range []bool{true, false} {
		t.Run(fmt.Sprint("ordered=", ordered), func(t *testing.T) {
			d := r.decoder()
			defer r.release(d)
			d.begin(time.Now(), ordered)
			for _, l := range orderLines {
				d.add([]byte(l)) // one datagram each
			}
			d.finish()
			var kinds []string
			var ev tokenevent.Event
			for _, lr := range d.logs.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().All() {
				require.NoError(t, tokenrecord.ReadRecord(lr, tokenevent.Limits{}, &ev, func(e *tokenevent.Event) {
					kinds = append(kinds, fmt.Sprintf("%d@%d", e.Kind, (e.TimeUnixNano-1700000000000000000)/1e6))
				}))
			}
			want := []string{"1@0", "2@100", "2@120", "2@140", "3@140"}
			if !ordered {
				want = []string{"1@0", "2@100", "2@120", "3@140", "2@140"} // as they came: HTTP bodies
			}
			assert.Equal(t, want, kinds)
		})
	}
}
