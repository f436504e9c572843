// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenparse"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// lineErrorsKept is how many line errors a batch keeps for its response; the
// rest are only counted, except the one that cuts the batch at its line
// limit, always kept.
const lineErrorsKept = 10

// batchDecoder turns one request body or datagram into log records. It is
// pooled: its parser keeps the session ID intern table warm between batches.
type batchDecoder struct {
	parser   *tokenparse.Parser
	writer   *tokenrecord.RecordWriter
	maxLines int

	logs plog.Logs
	// observed is when the batch began.
	observed time.Time
	// lineBase is added to the line numbers of the errors: a stream's
	// lines are numbered from its first, across batches.
	lineBase int
	accepted int
	rejected int
	// truncated counts the bodies cut at maxLines.
	truncated int
	errs      []*tokenparse.LineError
	// records is the batch's record slice; lastRecords how many records
	// the decoder's previous batch held, the room a batch's slice is made
	// with: grown from empty, it was reallocated a dozen times per batch
	// of a thousand records.
	records     plog.LogRecordSlice
	lastRecords int
}

// decode parses body into d.logs, counting accepted and rejected lines and
// keeping the first lineErrorsKept errors.
func (d *batchDecoder) decode(body []byte, observed time.Time) {
	d.begin(observed, false)
	d.add(body)
	d.finish()
}

// begin starts a batch that add fills with one or more bodies (UDP
// datagrams read together). ordered: the bodies may have overtaken each
// other (datagrams), so each session's events are put in time order
// before they go (tokenrecord's SetOrdered).
func (d *batchDecoder) begin(observed time.Time, ordered bool) {
	d.logs = plog.NewLogs()
	d.observed, d.lineBase = observed, 0
	d.accepted, d.rejected, d.truncated, d.errs = 0, 0, 0, d.errs[:0]
	sl := d.logs.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	sl.Scope().SetName(metadata.ScopeName)
	d.records = sl.LogRecords()
	d.records.EnsureCapacity(d.lastRecords)
	d.writer.Reset(d.records, pcommon.NewTimestampFromTime(observed))
	d.writer.SetOrdered(ordered)
}

// add parses one body into the batch; line limits and numbers are per body.
// A session's tokens are packed across the bodies of the batch.
func (d *batchDecoder) add(body []byte) {
	d.parser.ParseBatch(body, d.maxLines, d.onEvent, d.onError)
}

// finish completes the batch's records (the packed ones are written last).
func (d *batchDecoder) finish() {
	d.writer.Flush()
	d.lastRecords = d.records.Len()
}

// addLines parses lines of a stream into the batch: no line limit (a
// stream's batch ends at it instead), and line numbers from lineBase on.
func (d *batchDecoder) addLines(lines []byte) {
	d.parser.ParseBatch(lines, 0, d.onEvent, d.onError)
}

func (d *batchDecoder) onEvent(ev *tokenevent.Event) {
	d.accepted++
	d.writer.Append(ev)
}

func (d *batchDecoder) onError(e *tokenparse.LineError) {
	e.Line += d.lineBase
	d.reject(e)
}

// reject counts a rejected line and keeps its error, numbered already.
func (d *batchDecoder) reject(e *tokenparse.LineError) {
	d.rejected += 1 + e.Unread
	if e.Unread > 0 {
		d.truncated++
	}
	// The error cutting the batch is always kept: the client must learn
	// that the rest was not read.
	if len(d.errs) < lineErrorsKept || e.Unread > 0 {
		d.errs = append(d.errs, e)
	}
}
