package tokenevent

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newEvent(kind Kind) Event {
	var ev Event
	ev.Reset()
	ev.Kind, ev.SessionID, ev.TimeUnixNano = kind, "s", 1
	return ev
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(ev *Event)
		kind Kind
		want string // "" for valid
	}{
		{"start", func(*Event) {}, KindStart, ""},
		{"every start field", func(ev *Event) {
			ev.TraceID, ev.SpanID, ev.ParentSpanID = TraceID{1}, SpanID{2}, SpanID{3}
			ev.Model, ev.Operation, ev.PromptTokens, ev.Engine = "m", OperationTextCompletion, 0, "e"
			ev.Attributes = []Attribute{{"a", ""}, {"b", "2"}}
		}, KindStart, ""},
		{"fields of other kinds are ignored", func(ev *Event) { ev.Count, ev.CompletionTokens, ev.Error = 0, -7, "x" }, KindStart, ""},
		{"no kind", func(ev *Event) { ev.Kind = 0 }, KindStart, "event: want start, token or end, got kind 0"},
		{"no session", func(ev *Event) { ev.SessionID = "" }, KindToken, "session_id: must not be empty"},
		{"long session", func(ev *Event) { ev.SessionID = strings.Repeat("x", 257) }, KindEnd, "session_id: 257 bytes, limit is 256"},
		{"session at the limit", func(ev *Event) { ev.SessionID = strings.Repeat("é", 128) }, KindEnd, ""},
		{"session with invalid UTF-8", func(ev *Event) { ev.SessionID = strings.Repeat("\xff", 86) }, KindEnd, "session_id: 258 bytes, limit is 256"},
		{"no time", func(ev *Event) { ev.TimeUnixNano = 0 }, KindToken, "time_unix_nano: must be greater than 0"},
		{"time past int64", func(ev *Event) { ev.TimeUnixNano = 1 << 63 }, KindToken, "time_unix_nano: integer out of range"},
		{"count 0", func(ev *Event) { ev.Count = 0 }, KindToken, "count: must be at least 1"},
		{"count over the cap", func(ev *Event) { ev.Count = MaxCount + 1 }, KindToken, "count: at most 65536, got 65537"},
		{"seq out of range", func(ev *Event) { ev.Seq, ev.HasSeq = 1<<63, true }, KindToken, "seq: integer out of range"},
		{"tracestate too long", func(ev *Event) { ev.TraceState = strings.Repeat("a", 513) }, KindStart, "tracestate: 513 bytes, limit is 512"},
		{"operation", func(ev *Event) { ev.Operation = "embeddings" }, KindStart, `operation: want chat or text_completion, got "embeddings"`},
		{"prompt tokens", func(ev *Event) { ev.PromptTokens = -2 }, KindStart, "prompt_tokens: must not be negative, got -2"},
		{"completion tokens", func(ev *Event) { ev.CompletionTokens = -2 }, KindEnd, "completion_tokens: must not be negative, got -2"},
		{"empty key", func(ev *Event) { ev.Attributes = []Attribute{{"", "v"}} }, KindStart, "attributes: empty key"},
		{"duplicate key", func(ev *Event) { ev.Attributes = []Attribute{{"a", "1"}, {"a", "2"}} }, KindStart, "attributes.a: duplicate key"},
		{"too many", func(ev *Event) {
			for i := range 33 {
				ev.Attributes = append(ev.Attributes, Attribute{Key: fmt.Sprint(i)})
			}
		}, KindStart, "attributes: more than 32 entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := newEvent(tt.kind)
			tt.edit(&ev)
			err := ev.Validate(Limits{})
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.want)
			var fe *FieldError
			assert.ErrorAs(t, err, &fe)
		})
	}
	ev := newEvent(KindStart)
	ev.SessionID = "12345"
	ev.Attributes = []Attribute{{"a", "1"}, {"b", "2"}}
	require.EqualError(t, ev.Validate(Limits{MaxSessionIDBytes: 4}), "session_id: 5 bytes, limit is 4")
	ev.SessionID = "1"
	require.EqualError(t, ev.Validate(Limits{MaxAttributes: 1}), "attributes: more than 1 entries")
}

// FuzzValidate holds Event.Validate to the Parser: an event it accepts
// encodes to a line the Parser accepts and reads back the same; an event
// whose line the Parser rejects it rejects too.
func FuzzValidate(f *testing.F) {
	f.Add(uint8(1), "s", uint64(1), "chat", int64(-1), int64(1), "a", "b")
	f.Add(uint8(2), "", uint64(5), "", int64(0), int64(0), "", "")
	f.Add(uint8(3), "\xff\xfe", uint64(1<<63), "x", int64(-2), int64(-1), "a", "a")
	f.Add(uint8(0), strings.Repeat("é", 130), uint64(9), "text_completion", int64(7), int64(3), "k", "")
	p := NewParser(Limits{MaxLineBytes: 1 << 20})
	f.Fuzz(func(t *testing.T, kind uint8, sid string, tm uint64, op string, tokens, count int64, key1, key2 string) {
		var ev Event
		ev.Reset()
		ev.Kind, ev.SessionID, ev.TimeUnixNano = Kind(kind%4), sid, tm
		ev.Operation, ev.PromptTokens, ev.CompletionTokens, ev.Count = op, tokens, tokens, count
		ev.Model = op
		binary.LittleEndian.PutUint64(ev.TraceID[:], tm)
		if key1 != "" || key2 != "" {
			ev.Attributes = []Attribute{{Key: key1, Value: key2}, {Key: key2, Value: key1}}
		}
		verr := ev.Validate(Limits{})
		line := AppendJSON(nil, &ev)
		var got Event
		perr := p.Parse(line[:len(line)-1], &got)
		if verr == nil {
			require.NoError(t, perr, "Validate accepts what the Parser rejects: %s", line)
			// AppendJSON replaces invalid UTF-8, so only valid text reads
			// back byte for byte.
			if utf8.ValidString(sid + op + key1 + key2) {
				require.Equal(t, string(line), string(AppendJSON(nil, &got)), "the event does not read back the same")
			}
		}
		if perr != nil {
			require.Error(t, verr, "Validate accepts %s, which the Parser rejects: %v", line, perr)
		}
	})
}
