// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"slices"
)

// RequestRecord is one line of -requests-out: what the client saw of one
// request, so that per-request figures can be compared with another source
// (the collector's spans, by TraceID) or plotted as a distribution.
type RequestRecord struct {
	Index         int    `json:"index"`
	Warmup        bool   `json:"warmup"`
	Long          bool   `json:"long,omitempty"` // drawn from the -long-share
	StartUnixNano int64  `json:"start_unix_nano,omitempty"`
	OK            bool   `json:"ok"`
	Error         string `json:"error,omitempty"` // the error class, as counted in the report
	Interrupted   bool   `json:"interrupted,omitempty"`
	PromptTokens  int    `json:"prompt_tokens"` // usage, else the prompt's word count
	OutputTokens  int    `json:"output_tokens"`
	// Timings in ms; zero for a failed request.
	TTFTms   float64 `json:"ttft_ms"`
	TPOTms   float64 `json:"tpot_ms"`
	E2Ems    float64 `json:"e2e_ms"`
	MaxITLms float64 `json:"max_itl_ms"`
	ITLCount int     `json:"itl_count"`
	TraceID  string  `json:"trace_id,omitempty"` // with -traceparent
	// Attempt is 0 for the request's first sending, n for its n-th retry
	// (-retry-stalled); Retried marks an attempt cut by a stall breaker
	// (error engine_stalled) and sent again.
	Attempt int  `json:"attempt,omitempty"`
	Retried bool `json:"retried,omitempty"`
	// ITLms are the gaps between the chunks, in order (with -requests-itl):
	// the first chunk came TTFTms after the start, and each next one its
	// gap later.
	ITLms []float64 `json:"itl_ms,omitempty"`
}

func recordOf(res *Result, withITL bool) RequestRecord {
	rec := RequestRecord{
		Index:        res.Spec.Index,
		Warmup:       res.Spec.Warmup,
		Long:         res.Spec.Long,
		OK:           res.OK,
		Error:        res.Err,
		Interrupted:  res.Interrupted,
		PromptTokens: res.PromptTokens,
		OutputTokens: res.OutputTokens,
		ITLCount:     len(res.ITLs),
		Attempt:      res.Attempt,
		Retried:      res.Retried,
	}
	if rec.PromptTokens == 0 {
		rec.PromptTokens = res.Spec.PromptWords
	}
	if !res.Start.IsZero() {
		rec.StartUnixNano = res.Start.UnixNano()
	}
	if res.Stalled {
		// The gaps the client waited through before the cut, the last
		// ending at the error event; the first chunk came TTFTms after the
		// start.
		rec.TTFTms = ms(res.TTFT)
	}
	if res.OK || res.Stalled {
		if res.OK {
			rec.TTFTms, rec.E2Ems, rec.TPOTms = ms(res.TTFT), ms(res.E2E), ms(res.TPOT())
		}
		if len(res.ITLs) > 0 {
			rec.MaxITLms = slices.Max(res.ITLs) * 1000
		}
		if withITL {
			rec.ITLms = make([]float64, len(res.ITLs))
			for i, gap := range res.ITLs {
				rec.ITLms[i] = gap * 1000
			}
		}
	}
	if res.Spec.TraceID != ([16]byte{}) {
		rec.TraceID = hex.EncodeToString(res.Spec.TraceID[:])
	}
	return rec
}

// requestLog writes RequestRecords as NDJSON. Not safe for concurrent use:
// the runner calls it under its mutex.
type requestLog struct {
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
	err error // first write error; later writes are skipped
}

func createRequestLog(path string) (*requestLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	return &requestLog{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

func (l *requestLog) write(rec RequestRecord) {
	if l.err == nil {
		l.err = l.enc.Encode(rec)
	}
}

func (l *requestLog) close() error {
	return errors.Join(l.err, l.w.Flush(), l.f.Close())
}

// newTraceContext returns a random trace ID and parent span ID, both
// non-zero as W3C Trace Context requires.
func newTraceContext() (traceID [16]byte, spanID [8]byte) {
	for traceID == ([16]byte{}) {
		_, _ = rand.Read(traceID[:])
	}
	for spanID == ([8]byte{}) {
		_, _ = rand.Read(spanID[:])
	}
	return traceID, spanID
}

// traceparent is the W3C header value with the sampled flag set.
func traceparent(traceID [16]byte, spanID [8]byte) string {
	return "00-" + hex.EncodeToString(traceID[:]) + "-" + hex.EncodeToString(spanID[:]) + "-01"
}
