// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// A batch's token lines allocate nothing: what a batch allocates (its
// records, one per session) does not grow with its tokens. Ten times the
// tokens of the same ten sessions cost the same allocations.
func TestDecodeAllocatesNothingPerToken(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector are its own")
	}
	r, err := newTokenStreamReceiver(createDefaultConfig().(*Config), receivertest.NewNopSettings(metadata.Type), nil)
	if err != nil {
		t.Fatal(err)
	}
	allocs := func(tokens int) float64 {
		var body []byte
		for i := range tokens {
			ev := tokenevent.Event{
				Kind: tokenevent.KindToken, SessionID: fmt.Sprintf("session-%d", i%10),
				TimeUnixNano: uint64(1_700_000_000_000_000_000 + i), Count: 1,
			}
			body = tokenevent.AppendJSON(body, &ev)
		}
		return testing.AllocsPerRun(10, func() {
			d := r.decoder()
			d.decode(body, time.Now())
			r.release(d)
		})
	}
	few, many := allocs(1000), allocs(10_000)
	assert.Equal(t, few, many, "allocations per batch: %v for 1000 tokens, %v for 10 000", few, many)
}
