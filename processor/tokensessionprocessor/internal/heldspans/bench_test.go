// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package heldspans

import (
	"encoding/binary"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

func benchTraceID(n int) pcommon.TraceID {
	var id pcommon.TraceID
	binary.LittleEndian.PutUint64(id[:8], uint64(n)*0x9e3779b97f4a7c15)
	binary.LittleEndian.PutUint64(id[8:], uint64(n))
	return id
}

// benchSource is a batch shaped like vLLM's: a resource with the usual
// k8s/host attributes and an llm_request span with GenAI attributes.
func benchSource(service string) source {
	s := newSource(service, "vllm.tracing")
	attrs := s.rs.Resource().Attributes()
	attrs.PutStr("service.version", "0.11.0")
	attrs.PutStr("k8s.namespace.name", "inference")
	attrs.PutStr("k8s.pod.name", "vllm-7d9f8-abcde")
	attrs.PutStr("k8s.node.name", "gpu-node-7")
	attrs.PutStr("cloud.region", "eu-west-1")
	attrs.PutInt("process.pid", 4242)
	return s
}

func benchSpan(s source) ptrace.Span {
	sp := s.span(benchTraceID(0), "llm_request")
	a := sp.Attributes()
	a.PutStr("gen_ai.operation.name", "chat")
	a.PutStr("gen_ai.response.model", "llama-3-8b")
	a.PutInt("gen_ai.usage.input_tokens", 812)
	a.PutInt("gen_ai.usage.output_tokens", 256)
	a.PutInt("gen_ai.request.max_tokens", 1024)
	a.PutDouble("gen_ai.request.temperature", 0.7)
	a.PutDouble("gen_ai.latency.time_to_first_token", 0.183)
	a.PutDouble("gen_ai.latency.e2e", 4.2)
	a.PutStr("gen_ai.response.id", "chatcmpl-0123456789abcdef")
	return sp
}

// BenchmarkHold holds one span per op from input batches of 1000 spans
// (100 traces of 10 spans). Building each batch, and dropping the previous
// batch's traces so 100 stay held, is outside the timer. "copy" is Hold,
// "move" is HoldMove.
func BenchmarkHold(b *testing.B) {
	for _, move := range []bool{false, true} {
		name := "copy"
		if move {
			name = "move"
		}
		b.Run(name, func(b *testing.B) {
			buf := newBuffer(b, DefaultConfig())
			tmpl := benchSource("vllm")
			tmplSpan := benchSpan(tmpl)
			const batch = 1000
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				b.StopTimer()
				if done > 0 {
					for t := done/10 - batch/10; t < done/10; t++ {
						buf.Release(benchTraceID(t), false, th0, ptrace.Traces{})
					}
				}
				n := min(batch, b.N-done)
				in := ptrace.NewTraces()
				rs := in.ResourceSpans().AppendEmpty()
				tmpl.rs.CopyTo(rs)
				spans := rs.ScopeSpans().At(0).Spans()
				for i := range n {
					sp := spans.AppendEmpty()
					tmplSpan.CopyTo(sp)
					sp.SetTraceID(benchTraceID((done + i) / 10))
				}
				ss := rs.ScopeSpans().At(0)
				b.StartTimer()
				for i := 1; i <= n; i++ { // the template's own spans come first
					sp := spans.At(spans.Len() - n - 1 + i)
					if !buf.hold(sp.TraceID(), rs.Resource(), rs.SchemaUrl(), ss.Scope(), ss.SchemaUrl(), sp, t0, move) {
						b.Fatal("refused")
					}
				}
				done += n
			}
		})
	}
}

// BenchmarkVerdictHit looks up trace IDs present in a full default-size cache.
func BenchmarkVerdictHit(b *testing.B) {
	buf := newBuffer(b, DefaultConfig())
	const n = 100_000
	ids := make([]pcommon.TraceID, n)
	for i := range ids {
		ids[i] = benchTraceID(i)
		buf.Release(ids[i], i%2 == 0, th0, ptrace.Traces{})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, _, known := buf.Verdict(ids[(i*7919)%n]); !known {
			b.Fatal("miss")
		}
	}
}

// BenchmarkVerdictInsert caches verdicts of new traces into a full
// default-size cache: every op evicts the least recently used entry.
func BenchmarkVerdictInsert(b *testing.B) {
	c := newVerdictCache(100_000)
	for i := range 200_000 {
		c.put(benchTraceID(i), true, th0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		c.put(benchTraceID(200_000+i), i%2 == 0, th0)
	}
}

// BenchmarkRelease releases one held trace of 10 spans (8 from vLLM, 2 from
// the gateway) per op; batches of 1000 traces share one dst, so equal
// resources merge. Holding them is outside the timer.
func BenchmarkRelease(b *testing.B) {
	for _, keep := range []bool{true, false} {
		name := "drop"
		if keep {
			name = "keep"
		}
		b.Run(name, func(b *testing.B) {
			buf := newBuffer(b, DefaultConfig())
			vllm, gw := benchSource("vllm"), benchSource("gateway")
			vllmSpan, gwSpan := benchSpan(vllm), benchSpan(gw)
			const batch = 1000
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				b.StopTimer()
				n := min(batch, b.N-done)
				for t := range n {
					id := benchTraceID(done + t)
					for s := range 10 {
						src, sp := vllm, vllmSpan
						if s%5 == 0 {
							src, sp = gw, gwSpan
						}
						buf.Hold(id, src.rs.Resource(), src.rs.SchemaUrl(), src.ss.Scope(), src.ss.SchemaUrl(), sp, t0)
					}
				}
				dst := ptrace.NewTraces()
				b.StartTimer()
				for t := range n {
					if kept, dropped := buf.Release(benchTraceID(done+t), keep, th0, dst); kept+dropped != 10 {
						b.Fatalf("released %d+%d", kept, dropped)
					}
				}
				done += n
			}
		})
	}
}
