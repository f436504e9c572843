// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package promconv turns a Prometheus exposition (the classic text format
// or OpenMetrics 1.0, as an engine's /metrics endpoint serves it) into
// pmetric: the codec of the token_stream receiver's vllm source, apart from
// its scraping, as prometheusreceiver/internal is for the prometheus
// receiver.
package promconv // import "github.com/otelcol-llm/otelcol-llm/internal/promconv"

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// AcceptHeader asks for the classic text format first: it is what
// expfmt parses completely. OpenMetrics 1.0 is accepted as well.
const AcceptHeader = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"

const openMetricsType = "application/openmetrics-text"

// ParseExposition parses a /metrics body with expfmt, choosing the format by
// the response's Content-Type: the classic text format (0.0.4; also when the
// type is missing or unknown) or OpenMetrics 1.0 (read by the same text
// parser, as expfmt.NewDecoder does). Delimited protobuf is refused: expfmt
// allocates what a message's length prefix claims, so a six-byte body could
// exhaust memory (and the scraper never asks for protobuf).
//
// For OpenMetrics the text parser files the samples of a counter declared as
// `# TYPE x counter` under an untyped family `x_total`; such families are
// turned back into counters, so a counter is named `x_total` in either
// format.
//
// OpenMetrics bodies are first rewritten by normalizeOpenMetrics (info,
// stateset and unknown families read as gauges and untyped, exemplars
// dropped, timestamps in seconds); families of a type it cannot convert are
// skipped, counted in the returned Skipped, and never fail the exposition.
func ParseExposition(body []byte, contentType string) (map[string]*dto.MetricFamily, Skipped, error) {
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	mediaType, _, _ := mime.ParseMediaType(contentType)
	switch mediaType {
	case openMetricsType:
		format = expfmt.Format(contentType)
	case expfmt.ProtoType:
		return nil, nil, fmt.Errorf("content type %q: protobuf exposition not supported, want text or OpenMetrics", contentType)
	}
	var skipped Skipped
	if mediaType == openMetricsType {
		body, skipped = normalizeOpenMetrics(body)
	}
	dec := expfmt.NewDecoder(bytes.NewReader(body), format)
	fams := make(map[string]*dto.MetricFamily)
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		fams[mf.GetName()] = mf
	}
	if mediaType == openMetricsType {
		fixOpenMetricsCounters(body, fams)
	}
	return fams, skipped, nil
}

// fixOpenMetricsCounters retypes the untyped `x_total` families of counters
// declared as `# TYPE x counter`.
func fixOpenMetricsCounters(body []byte, fams map[string]*dto.MetricFamily) {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, len(body)+1)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" || !strings.EqualFold(f[3], "counter") {
			continue
		}
		mf := fams[f[2]+"_total"]
		if mf == nil || mf.GetType() != dto.MetricType_UNTYPED {
			continue
		}
		mf.Type = dto.MetricType_COUNTER.Enum()
		for _, m := range mf.GetMetric() {
			if m.Untyped != nil {
				m.Counter = &dto.Counter{Value: m.Untyped.Value}
				m.Untyped = nil
			}
		}
	}
}
