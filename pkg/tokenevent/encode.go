// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenevent

import (
	"encoding/hex"
	"strconv"
	"unicode/utf8"
)

// AppendJSON appends ev as one wire line (a JSON object and a newline) to dst.
// Optional fields are written only when set, so Parse(AppendJSON(ev)) == ev.
func AppendJSON(dst []byte, ev *Event) []byte {
	dst = append(dst, `{"event":"`...)
	dst = append(dst, ev.Kind.String()...)
	if ev.Kind == KindShare {
		dst = append(dst, `","engine_request_id":`...)
		dst = appendString(dst, ev.EngineRequestID)
	} else {
		dst = append(dst, `","session_id":`...)
		dst = appendString(dst, ev.SessionID)
	}
	dst = append(dst, `,"time_unix_nano":`...)
	dst = strconv.AppendUint(dst, ev.TimeUnixNano, 10)
	switch ev.Kind {
	case KindStart:
		if !ev.TraceID.IsEmpty() {
			dst = append(dst, `,"trace_id":"`...)
			dst = hex.AppendEncode(dst, ev.TraceID[:])
			dst = append(dst, '"')
		}
		if !ev.SpanID.IsEmpty() {
			dst = append(dst, `,"span_id":"`...)
			dst = hex.AppendEncode(dst, ev.SpanID[:])
			dst = append(dst, '"')
		}
		if !ev.ParentSpanID.IsEmpty() {
			dst = append(dst, `,"parent_span_id":"`...)
			dst = hex.AppendEncode(dst, ev.ParentSpanID[:])
			dst = append(dst, '"')
		}
		dst = appendField(dst, "model", ev.Model)
		dst = appendField(dst, "operation", ev.Operation)
		if ev.PromptTokens >= 0 {
			dst = append(dst, `,"prompt_tokens":`...)
			dst = strconv.AppendInt(dst, ev.PromptTokens, 10)
		}
		dst = appendField(dst, "engine", ev.Engine)
		if len(ev.Attributes) > 0 {
			dst = append(dst, `,"attributes":{`...)
			for i, a := range ev.Attributes {
				if i > 0 {
					dst = append(dst, ',')
				}
				dst = appendString(dst, a.Key)
				dst = append(dst, ':')
				dst = appendString(dst, a.Value)
			}
			dst = append(dst, '}')
		}
		if ev.NoStream {
			dst = append(dst, `,"stream":false`...)
		}
		dst = appendField(dst, "tracestate", ev.TraceState)
	case KindToken:
		if ev.Count != 1 {
			dst = append(dst, `,"count":`...)
			dst = strconv.AppendInt(dst, ev.Count, 10)
		}
		if ev.HasSeq {
			dst = append(dst, `,"seq":`...)
			dst = strconv.AppendUint(dst, ev.Seq, 10)
		}
	case KindEnd:
		if ev.CompletionTokens >= 0 {
			dst = append(dst, `,"completion_tokens":`...)
			dst = strconv.AppendInt(dst, ev.CompletionTokens, 10)
		}
		dst = appendField(dst, "finish_reason", ev.FinishReason)
		dst = appendField(dst, "error", ev.Error)
		dst = appendField(dst, "response_model", ev.ResponseModel)
		for _, t := range [...]struct {
			key string
			ns  int64
		}{{"queue_time_ns", ev.QueueTimeNs}, {"prefill_time_ns", ev.PrefillTimeNs}, {"decode_time_ns", ev.DecodeTimeNs}} {
			if ev.HasTiming() && t.ns >= 0 {
				dst = append(dst, `,"`...)
				dst = append(dst, t.key...)
				dst = append(dst, `":`...)
				dst = strconv.AppendInt(dst, t.ns, 10)
			}
		}
		dst = appendEngineShare(dst, ev)
		if ev.Migrations > 0 {
			dst = append(dst, `,"migrations":`...)
			dst = strconv.AppendInt(dst, ev.Migrations, 10)
		}
	case KindShare:
		dst = appendField(dst, "engine", ev.Engine)
		dst = appendEngineShare(dst, ev)
	case KindMove:
		dst = appendField(dst, "engine", ev.Engine)
		dst = appendField(dst, "error", ev.Error)
		dst = append(dst, `,"count":`...)
		dst = strconv.AppendInt(dst, ev.Count, 10)
	}
	return append(dst, "}\n"...)
}

// appendEngineShare appends the engine's share fields of an end or share.
func appendEngineShare(dst []byte, ev *Event) []byte {
	for _, t := range [...]struct {
		key string
		v   int64
		has bool
	}{{"engine_time_prefill_ns", ev.EngineTimePrefillNs, ev.HasEngineTime}, {"engine_time_decode_ns", ev.EngineTimeDecodeNs, ev.HasEngineTime}, {"energy_mj", ev.EnergyMilliJ, ev.HasEnergy}} {
		if t.has && t.v >= 0 {
			dst = append(dst, `,"`...)
			dst = append(dst, t.key...)
			dst = append(dst, `":`...)
			dst = strconv.AppendInt(dst, t.v, 10)
		}
	}
	return dst
}

func appendField(dst []byte, key, value string) []byte {
	if value == "" {
		return dst
	}
	dst = append(dst, `,"`...)
	dst = append(dst, key...)
	dst = append(dst, `":`...)
	return appendString(dst, value)
}

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD, as
// encoding/json does.
func appendString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
