// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenrecord // import "github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"

import (
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// EntryError is ReadRecord's error for a batch token record
// (AttrTokenSessions) some of whose session entries could not be read:
// those were skipped, the others read.
type EntryError struct {
	// Skipped counts the entries skipped; the rest of a record whose frame
	// broke after its first entry counts as one.
	Skipped int
	// First is the first skipped entry's error.
	First *tokenevent.FieldError
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("%s; entries skipped: %d", e.First, e.Skipped)
}

func (e *EntryError) Unwrap() error { return e.First }

// skip counts a skipped entry, keeping the first's error.
func (e *EntryError) skip(n int, reason string) *EntryError {
	if e == nil {
		e = &EntryError{First: &tokenevent.FieldError{Field: AttrTokenSessions, Reason: fmt.Sprintf("entry %d: %s", n, reason)}}
	}
	e.Skipped++
	return e
}

// IsTokenBatch reports whether lr is a batch token record: an EventNameToken
// record with AttrTokenSessions.
func IsTokenBatch(lr plog.LogRecord) bool {
	if lr.EventName() != EventNameToken {
		return false
	}
	_, ok := lr.Attributes().Get(AttrTokenSessions)
	return ok
}

// readBatch reads a batch token record whose AttrTokenSessions is v and
// whose time, in ev, is checked, entry by entry. An entry whose session ID
// or events are invalid is skipped whole and the others read; where the
// frame (the entries' lengths and separators) breaks, the rest is skipped,
// as where the next entry begins is unknown. Either is an *EntryError,
// unless the frame breaks at the first entry: then nothing was read and
// the record is invalid.
func readBatch(attrs pcommon.Map, v pcommon.Value, limits tokenevent.Limits, ev *tokenevent.Event, fn func(*tokenevent.Event)) error {
	if v.Type() != pcommon.ValueTypeStr {
		return &tokenevent.FieldError{Field: AttrTokenSessions, Reason: "want a string, got " + v.Type().String()}
	}
	for _, k := range [...]string{AttrSessionID, AttrTokenEvents, AttrTokenCount, AttrTokenSeq} {
		if _, ok := attrs.Get(k); ok {
			return &tokenevent.FieldError{Field: AttrTokenSessions, Reason: "a batch record has no " + k}
		}
	}
	s, base := v.Str(), int64(ev.TimeUnixNano)
	var buf [64]packedEvent
	var skipped *EntryError
	for i, n := 0, 0; ; n++ {
		id, events, next, ok := batchEntry(s, i)
		if !ok {
			if n == 0 {
				return &tokenevent.FieldError{Field: AttrTokenSessions, Reason: "entry 0: " + frameReason}
			}
			return skipped.skip(n, frameReason+"; the rest not read")
		}
		if ferr := tokenevent.CheckSessionID(id, limits.MaxSessionIDBytes); ferr != nil {
			skipped = skipped.skip(n, "session ID "+ferr.Reason)
		} else {
			ev.SessionID = id
			if err := readPackedWith(events, base, buf[:], ev, fn); err != nil {
				reason := err.Error()
				var fe *tokenevent.FieldError
				if errors.As(err, &fe) {
					reason = fe.Reason
				}
				skipped = skipped.skip(n, reason)
			}
		}
		if next == len(s) {
			break
		}
		i = next + 1
	}
	if skipped != nil {
		return skipped
	}
	return nil
}

// frameReason is what a batch record's frame must be.
const frameReason = "want <session ID length> <session ID> <events>, entries separated by a newline"

// batchEntry reads the frame of an entry, "<ID length> <session ID>
// <events>", from s[i:], returning its session ID and events and where it
// ends: at the end of s or at the newline before the next entry.
func batchEntry(s string, i int) (id, events string, next int, ok bool) {
	size, j, ok := packedInt(s, i, false)
	ok = ok && j < len(s) && s[j] == ' ' && size <= int64(len(s)-j-1)
	if ok {
		j++
		id, j = s[j:j+int(size)], j+int(size)
		ok = j < len(s) && s[j] == ' '
	}
	if !ok {
		return "", "", 0, false
	}
	events = s[j+1:]
	next = len(s)
	if k := strings.IndexByte(events, '\n'); k >= 0 {
		events, next = events[:k], j+1+k
	}
	return id, events, next, true
}

// BatchSessions calls fn for each session entry of the batch token record
// lr that ReadRecord read, which must have returned nil or an *EntryError
// for lr, in order, with its session ID and its events in the
// AttrTokenEvents form, offsets from lr's timestamp (AppendSessionRecord
// writes them as a record of the session). The strings are part of lr's
// attribute.
func BatchSessions(lr plog.LogRecord, limits tokenevent.Limits, fn func(sessionID, events string)) {
	v, _ := lr.Attributes().Get(AttrTokenSessions)
	s, base := v.Str(), int64(lr.Timestamp())
	var first [1]packedEvent
	for i := 0; ; {
		id, events, next, ok := batchEntry(s, i)
		if !ok {
			return
		}
		if tokenevent.CheckSessionID(id, limits.MaxSessionIDBytes) == nil {
			if _, err := scanPacked(events, base, first[:]); err == nil {
				fn(id, events)
			}
		}
		if next == len(s) {
			return
		}
		i = next + 1
	}
}

// AppendSessionRecord appends to dst the record of one session's entry of
// the batch token record batch (see BatchSessions): the session's own
// packed token record, stamped as batch is. The strings are copied, so the
// record does not hold batch's attribute.
func AppendSessionRecord(dst plog.LogRecordSlice, batch plog.LogRecord, sessionID, events string) {
	lr := dst.AppendEmpty()
	lr.SetEventName(EventNameToken)
	lr.SetTimestamp(batch.Timestamp())
	lr.SetObservedTimestamp(batch.ObservedTimestamp())
	attrs := lr.Attributes()
	attrs.EnsureCapacity(2)
	attrs.PutStr(AttrSessionID, strings.Clone(sessionID))
	attrs.PutStr(AttrTokenEvents, strings.Clone(events))
}
