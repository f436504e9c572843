// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package promconv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

const protoContentType = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"

// fuzzContentTypes are the Content-Types a fuzzed body is parsed as: the
// text format, OpenMetrics 1.0, delimited protobuf, none and an unknown one.
var fuzzContentTypes = []string{
	textContentType,
	openMetricsContentType,
	protoContentType,
	"",
	"application/json",
}

// encodeProto encodes families as delimited protobuf, as a Prometheus
// client answers Accept: application/vnd.google.protobuf.
func encodeProto(tb testing.TB, fams ...*dto.MetricFamily) []byte {
	tb.Helper()
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeProtoDelim))
	for _, mf := range fams {
		if err := enc.Encode(mf); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes()
}

func ptr[T any](v T) *T { return &v }

// protoSeedFamilies is a small valid exposition in protobuf: a gauge, a
// counter with its _created gauge and a histogram.
func protoSeedFamilies() []*dto.MetricFamily {
	lbl := []*dto.LabelPair{{Name: ptr("engine"), Value: ptr("0")}, {Name: ptr("model_name"), Value: ptr("m")}}
	return []*dto.MetricFamily{
		{Name: ptr("vllm:num_requests_running"), Type: dto.MetricType_GAUGE.Enum(), Metric: []*dto.Metric{
			{Label: lbl, Gauge: &dto.Gauge{Value: ptr(12.0)}},
		}},
		{Name: ptr("vllm:num_preemptions_total"), Type: dto.MetricType_COUNTER.Enum(), Metric: []*dto.Metric{
			{Label: lbl, Counter: &dto.Counter{Value: ptr(4.0)}},
		}},
		{Name: ptr("vllm:num_preemptions_created"), Type: dto.MetricType_GAUGE.Enum(), Metric: []*dto.Metric{
			{Label: lbl, Gauge: &dto.Gauge{Value: ptr(1754000000.0123)}},
		}},
		{Name: ptr("vllm:e2e_request_latency_seconds"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{
			{Label: lbl, Histogram: &dto.Histogram{
				SampleCount: ptr(uint64(3)), SampleSum: ptr(4.5),
				Bucket: []*dto.Bucket{
					{UpperBound: ptr(1.0), CumulativeCount: ptr(uint64(2))},
					{UpperBound: ptr(math.Inf(1)), CumulativeCount: ptr(uint64(3))},
				},
			}},
		}},
	}
}

// fuzzSeeds are the bodies the fuzz target starts from, each with the index
// of the Content-Type it is parsed as.
func fuzzSeeds(tb testing.TB) []struct {
	body []byte
	ct   uint8
} {
	fixture := fixtureBytes(tb)
	hist := "# TYPE h histogram\n"
	seeds := []struct {
		body []byte
		ct   uint8
	}{
		{fixture, 0},
		{fixture, 3},
		{[]byte(multiprocessBody(string(fixture))), 0},
		{fixture[:len(fixture)/2], 0}, // truncated mid-line
		{[]byte(strings.ReplaceAll(string(fixture), "# TYPE", "# TYPO")), 0},
		{[]byte(olderNamesBody), 0},
		{[]byte(dataParallelBody), 0},
		{[]byte("<html><body>not found</body></html>\n"), 0},
		{[]byte(`{"error": "nope"}`), 4},
		{[]byte("vllm:num_requests_running{engine=\"0\"} twelve\n"), 0},
		{[]byte("vllm:num_requests_running{engine=\"0\""), 0},
		{[]byte("# TYPE x counter\nx_total 1\nx_created 1.754e+09\n# EOF\n"), 1},
		{[]byte("# TYPE x counter\nx_total 1\n"), 1}, // OpenMetrics without # EOF
		{[]byte("# TYPE i info\ni_info{v=\"1\"} 1\n# TYPE s stateset\ns{s=\"a\"} 1\n# TYPE u unknown\nu 1 17.5\n# EOF\n"), 1},
		{[]byte("# TYPE g gaugehistogram\ng_bucket{le=\"+Inf\"} 1\ng_gcount 1\n# TYPE c counter\nc_total{a=\"}\\\" # {\"} 2 # {t=\"x\"} 1 3.5\n# EOF\n"), 1},
		{[]byte(hist + "h_bucket{le=\"1\"} 5\nh_bucket{le=\"2\"} 3\nh_bucket{le=\"+Inf\"} 5\nh_count 5\nh_sum 1\n"), 0},
		{[]byte(hist + "h_bucket{le=\"1\"} 5\nh_bucket{le=\"1\"} 5\nh_bucket{le=\"+Inf\"} 5\nh_count 5\n"), 0},
		{[]byte(hist + "h_bucket{le=\"-Inf\"} 0\nh_bucket{le=\"NaN\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n"), 0},
		{[]byte(hist + "h_bucket{le=\"1\"} 1.5\nh_bucket{le=\"+Inf\"} 1e30\nh_count +Inf\nh_sum NaN\n"), 0},
		{[]byte(hist + "h_bucket{le=\"1\"} -1\nh_count 2\n"), 0},
		{[]byte(hist + "h_bucket{le=\"1\"} 4\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n"), 0},
		{[]byte(hist + "h_sum 2\nh_count 2\n"), 0},
		{[]byte("# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\ns_created 5\n"), 0},
		{[]byte("# TYPE g gauge\ng 1 1754000000000\ng_created -1\n# TYPE c counter\nc NaN\nc_created +Inf\n"), 0},
		{encodeProto(tb, protoSeedFamilies()...), 2},
		{encodeProto(tb, protoSeedFamilies()...)[:20], 2},
		{[]byte{0x05, 0x0a, 0x03}, 2}, // length prefix past the end
		{nil, 0},
	}
	return seeds
}

// FuzzConvertExposition feeds arbitrary bodies, under each Content-Type the
// scraper can receive, to parseExposition and convert: neither may panic,
// parseExposition either returns families or an error, and what convert
// returns for them is well formed (histograms: one more bucket than bounds,
// buckets adding up to count). Each body is converted twice by the same
// converter, so the series state of the second scrape is exercised too.
func FuzzConvertExposition(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s.body, s.ct)
	}
	f.Fuzz(func(t *testing.T, body []byte, ct uint8) {
		contentType := fuzzContentTypes[int(ct)%len(fuzzContentTypes)]
		fams, _, err := ParseExposition(body, contentType)
		if err != nil {
			if fams != nil {
				t.Fatalf("families returned along with error %v", err)
			}
			return
		}
		c := NewConverter(testScope, nil)
		now := time.Unix(1754000600, 0)
		for range 2 {
			md := c.Convert(fams, now)
			if err := checkWellFormed(md); err != nil {
				t.Fatalf("content type %q: %v", contentType, err)
			}
			now = now.Add(15 * time.Second)
		}
	})
}

// checkWellFormed checks what convert promises of every batch.
func checkWellFormed(md pmetric.Metrics) error {
	if md.ResourceMetrics().Len() != 1 || md.ResourceMetrics().At(0).ScopeMetrics().Len() != 1 {
		return fmt.Errorf("want one resource and one scope")
	}
	for _, m := range md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().All() {
		switch m.Type() {
		case pmetric.MetricTypeGauge:
		case pmetric.MetricTypeSum:
			if !m.Sum().IsMonotonic() || m.Sum().AggregationTemporality() != pmetric.AggregationTemporalityCumulative {
				return fmt.Errorf("%s: sum not cumulative monotonic", m.Name())
			}
		case pmetric.MetricTypeHistogram:
			for _, dp := range m.Histogram().DataPoints().All() {
				if dp.BucketCounts().Len() != dp.ExplicitBounds().Len()+1 {
					return fmt.Errorf("%s: %d buckets for %d bounds", m.Name(), dp.BucketCounts().Len(), dp.ExplicitBounds().Len())
				}
				var total uint64
				for _, n := range dp.BucketCounts().All() {
					total += n
				}
				if total != dp.Count() {
					return fmt.Errorf("%s: buckets add up to %d, count %d", m.Name(), total, dp.Count())
				}
				for i, b := range dp.ExplicitBounds().All() {
					if math.IsNaN(b) || math.IsInf(b, 1) {
						return fmt.Errorf("%s: bound %d is %g", m.Name(), i, b)
					}
				}
			}
		default:
			return fmt.Errorf("%s: unexpected type %s", m.Name(), m.Type())
		}
	}
	return nil
}

// TestConvertExpositionSeeds runs the fuzz seeds as a plain test and checks
// which of them must fail to parse and which must convert.
func TestConvertExpositionSeeds(t *testing.T) {
	seeds := fuzzSeeds(t)
	var parsed, failed int
	for i, s := range seeds {
		contentType := fuzzContentTypes[int(s.ct)%len(fuzzContentTypes)]
		fams, _, err := ParseExposition(s.body, contentType)
		if err != nil {
			failed++
			continue
		}
		parsed++
		c := NewConverter(testScope, nil)
		if err := checkWellFormed(c.Convert(fams, time.Unix(1754000600, 0))); err != nil {
			t.Errorf("seed %d: %v", i, err)
		}
	}
	// The fixture and its variants parse; the garbage does not.
	if parsed < 8 || failed < 5 {
		t.Errorf("parsed %d, failed %d seeds", parsed, failed)
	}
}

// TestVLLMConversionRejects covers bodies that once crashed or corrupted the
// conversion (found by these tests): each is refused or its point dropped.
func TestVLLMConversionRejects(t *testing.T) {
	convert := func(t *testing.T, body []byte, contentType string) (md pmetric.Metrics, panicked any) {
		t.Helper()
		fams, _, err := ParseExposition(body, contentType)
		if err != nil {
			t.Fatalf("parse: %v", err)
		}
		defer func() { panicked = recover() }()
		return NewConverter(testScope, nil).Convert(fams, time.Unix(1754000600, 0)), nil
	}
	// A histogram family whose metric carries no histogram (possible in
	// protobuf) used to panic in deCumulate.
	t.Run("histogram without histogram", func(t *testing.T) {
		_, _, _, err := deCumulate(nil)
		if err == nil {
			t.Error("no error for a missing histogram")
		}
	})

	// expfmt's protobuf decoder allocates what a message's length prefix
	// claims: a 5-byte body allocated 1 GiB, a 6-byte one declaring 1 TiB
	// ended the process. Protobuf is refused.
	t.Run("protobuf length prefix", func(t *testing.T) {
		body := binary.AppendUvarint(nil, 1<<30)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _, err := ParseExposition(body, protoContentType)
		runtime.ReadMemStats(&after)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
			t.Errorf("a %d-byte body made parseExposition allocate %d bytes (err %v)", len(body), alloc, err)
		}
		if err == nil {
			t.Error("protobuf accepted")
		}
	})

	// Repeated le values would give bounds that do not strictly increase
	// (OTLP requires it), and le="-Inf" an infinite bound: such a
	// histogram point is dropped. So is one whose counts are out of range
	// (a uint64 conversion of such a float is undefined).
	dropped := func(t *testing.T, body string) {
		t.Helper()
		md, p := convert(t, []byte(body), textContentType)
		if p != nil {
			t.Fatal(p)
		}
		if dps := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Histogram().DataPoints(); dps.Len() != 0 {
			t.Errorf("point kept: bounds %v, count %d", dps.At(0).ExplicitBounds().AsRaw(), dps.At(0).Count())
		}
	}
	t.Run("duplicate le", func(t *testing.T) {
		dropped(t, "# TYPE h histogram\nh_bucket{le=\"1\"} 5\nh_bucket{le=\"1\"} 5\nh_bucket{le=\"+Inf\"} 5\nh_count 5\n")
	})
	t.Run("-Inf le", func(t *testing.T) {
		dropped(t, "# TYPE h histogram\nh_bucket{le=\"-Inf\"} 0\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n")
	})
	t.Run("infinite count", func(t *testing.T) {
		md, p := convert(t, []byte("# TYPE h histogram\nh_bucket{le=\"1\"} 1.5\nh_bucket{le=\"+Inf\"} 1e30\nh_count +Inf\n"), textContentType)
		if p != nil {
			t.Fatal(p)
		}
		if dps := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Histogram().DataPoints(); dps.Len() != 0 {
			t.Errorf("point with count %d kept, want it dropped", dps.At(0).Count())
		}
	})
}
