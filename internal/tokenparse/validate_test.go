// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenparse

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// FuzzValidate holds Event.Validate to the Parser: an event it accepts
// encodes to a line the Parser accepts and reads back the same; an event
// whose line the Parser rejects it rejects too.
func FuzzValidate(f *testing.F) {
	f.Add(uint8(1), "s", uint64(1), "chat", int64(-1), int64(1), "a", "b")
	f.Add(uint8(2), "", uint64(5), "", int64(0), int64(0), "", "")
	f.Add(uint8(3), "\xff\xfe", uint64(1<<63), "x", int64(-2), int64(-1), "a", "a")
	f.Add(uint8(0), strings.Repeat("é", 130), uint64(9), "text_completion", int64(7), int64(3), "k", "")
	f.Add(uint8(1), "s", uint64(1), strings.Repeat("é", 200), int64(-1), int64(1), strings.Repeat("k", 257), strings.Repeat("v", 300))
	f.Add(uint8(4), "cmpl-1-0a1b2c3d", uint64(1), "", int64(0), int64(1), "", strings.Repeat("e", 300))
	p := NewParser(tokenevent.Limits{MaxLineBytes: 1 << 20})
	f.Fuzz(func(t *testing.T, kind uint8, sid string, tm uint64, op string, tokens, count int64, key1, key2 string) {
		var ev tokenevent.Event
		ev.Reset()
		ev.Kind, ev.SessionID, ev.TimeUnixNano = tokenevent.Kind(kind%5), sid, tm
		ev.EngineRequestID, ev.Engine = sid, key2 // a share's
		ev.Operation, ev.PromptTokens, ev.CompletionTokens, ev.Count = op, tokens, tokens, count
		ev.Model = op
		binary.LittleEndian.PutUint64(ev.TraceID[:], tm)
		if key1 != "" || key2 != "" {
			ev.Attributes = []tokenevent.Attribute{{Key: key1, Value: key2}, {Key: key2, Value: key1}}
		}
		verr := ev.Validate(tokenevent.Limits{})
		line := tokenevent.AppendJSON(nil, &ev)
		var got tokenevent.Event
		perr := p.Parse(line[:len(line)-1], &got)
		if verr == nil {
			require.NoError(t, perr, "Validate accepts what the Parser rejects: %s", line)
			// AppendJSON replaces invalid UTF-8, so only valid text reads
			// back byte for byte (each string valid: two invalid halves can
			// make a valid whole); values over their bound read back cut.
			if utf8.ValidString(sid) && utf8.ValidString(op) && utf8.ValidString(key1) && utf8.ValidString(key2) {
				want := ev
				want.Attributes = slices.Clone(ev.Attributes)
				want.CutValues()
				require.Equal(t, string(tokenevent.AppendJSON(nil, &want)), string(tokenevent.AppendJSON(nil, &got)), "the event does not read back the same")
			}
		}
		if perr != nil {
			require.Error(t, verr, "Validate accepts %s, which the Parser rejects: %v", line, perr)
		}
	})
}
