// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/promconv"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
)

// scrapeLogEvery is how often at most a failing target's errors are logged.
const scrapeLogEvery = time.Minute

// Reasons a scrape fails, the reason attribute of the failed scrapes counter.
const (
	reasonConnection = "connection" // dial or transport error (e.g. refused)
	reasonTimeout    = "timeout"    // the scrape took longer than the timeout
	reasonStatus     = "status"     // a response other than 200
	reasonOversized  = "oversized"  // the body is over max_body_bytes
	reasonParse      = "parse"      // the body is no valid exposition
)

// scrapeSink is what the vllm scraper is given by the receiver: the metrics
// pipeline, with the standard receiver observability around it, the
// scraper's counters and the metrics logger.
type scrapeSink interface {
	ConsumeMetrics(ctx context.Context, md pmetric.Metrics) error
	counters() scrapeCounters
	Logger() *zap.Logger
}

// scrapeCounters are the scraper's self-telemetry.
type scrapeCounters struct {
	invalidDataPoints, skippedFamilies, failedScrapes metric.Int64Counter
}

// vllmScraper scrapes each target in its own goroutine and hands what it
// reads to the metrics consumer. A failing target never affects the others.
type vllmScraper struct {
	sink     scrapeSink
	counters scrapeCounters
	log      *zap.Logger
	cfg      *VLLMConfig
	host     component.Host
	client   *http.Client
	timeout  time.Duration

	cancel context.CancelFunc
	done   sync.WaitGroup

	mu      sync.Mutex
	failing map[string]bool // targets whose last scrape failed
}

// vllmTarget is the state of one target, owned by its goroutine.
type vllmTarget struct {
	url  string // as configured: may carry credentials, used only to scrape
	name string // redacted: what logs, status and telemetry show
	conv *promconv.Converter

	lastLogged    time.Time // last failure logged
	suppressed    int       // failures not logged since lastLogged
	lastRecovered time.Time // last recovery logged
}

func startVLLMScraper(ctx context.Context, cfg *VLLMConfig, sink scrapeSink, host component.Host, set component.TelemetrySettings) (*vllmScraper, error) {
	client, err := cfg.Client.ToClient(ctx, host.GetExtensions(), set)
	if err != nil {
		return nil, fmt.Errorf("vllm::client: %w", err)
	}
	s := &vllmScraper{
		sink: sink, counters: sink.counters(), log: sink.Logger(), cfg: cfg, host: host, client: client,
		timeout: cfg.scrapeTimeout(),
		failing: make(map[string]bool),
	}
	targets := make([]*vllmTarget, 0, len(cfg.Targets))
	for _, raw := range cfg.Targets {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("vllm::targets: %w", err)
		}
		targets = append(targets, &vllmTarget{
			url: raw, name: redactURL(u),
			conv: promconv.NewConverter(metadata.ScopeName, promconv.TargetResource(u)),
		})
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, t := range targets {
		s.done.Add(1)
		go s.run(runCtx, t)
	}
	return s, nil
}

func (s *vllmScraper) shutdown() {
	s.cancel()
	s.done.Wait()
	s.client.CloseIdleConnections()
}

// run scrapes t at once and then every interval until ctx ends.
func (s *vllmScraper) run(ctx context.Context, t *vllmTarget) {
	defer s.done.Done()
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		s.scrape(ctx, t)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *vllmScraper) scrape(ctx context.Context, t *vllmTarget) {
	now := time.Now()
	fams, skipped, reason, err := s.fetch(ctx, t)
	if ctx.Err() != nil {
		return // shutting down
	}
	if err != nil {
		err = redactURLError(err, t.name)
		s.failed(ctx, t, reason, err)
		return
	}
	md := t.conv.Convert(fams, now)
	if n := t.conv.Dropped(); n > 0 {
		s.counters.invalidDataPoints.Add(ctx, int64(n))
		s.log.Debug("invalid histogram data points dropped",
			zap.String("target", t.name), zap.Int("dropped", n))
	}
	s.countSkipped(ctx, skipped)
	s.countSkipped(ctx, t.conv.Skipped())
	s.recovered(t)
	// The hand-over is not cancelled with the scrape loop: a scrape taken
	// is delivered whole. Shutdown canceling it would abort an exporter's
	// request mid-body (its backend sees a truncated body) and lose the
	// engine's last state; shutdown waits for it instead, bounded by the
	// pipeline's own timeouts.
	if err := s.sink.ConsumeMetrics(context.WithoutCancel(ctx), md); err != nil {
		s.log.Debug("pipeline refused engine metrics", zap.String("target", t.name), zap.Error(err))
	}
}

// fetch GETs and parses one exposition; on failure it says why.
func (s *vllmScraper) fetch(ctx context.Context, t *vllmTarget) (fams map[string]*dto.MetricFamily, skipped promconv.Skipped, reason string, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, http.NoBody)
	if err != nil {
		return nil, nil, reasonConnection, err
	}
	req.Header.Set("Accept", promconv.AcceptHeader)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, nil, transportReason(err), err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		return nil, nil, reasonStatus, fmt.Errorf("unexpected status %s", resp.Status)
	}
	limit := s.cfg.MaxBodyBytes
	if resp.ContentLength > limit {
		return nil, nil, reasonOversized, fmt.Errorf("body of %d bytes exceeds max_body_bytes (%d)", resp.ContentLength, limit)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, nil, transportReason(err), fmt.Errorf("reading the body: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, nil, reasonOversized, fmt.Errorf("body exceeds max_body_bytes (%d)", limit)
	}
	parsed, skipped, err := promconv.ParseExposition(body, resp.Header.Get("Content-Type"))
	if err != nil {
		return nil, nil, reasonParse, fmt.Errorf("parsing the exposition: %w", err)
	}
	return parsed, skipped, "", nil
}

// countSkipped counts the families left out of a scrape, by reason.
func (s *vllmScraper) countSkipped(ctx context.Context, skipped promconv.Skipped) {
	for reason, n := range skipped {
		s.counters.skippedFamilies.Add(ctx, int64(n),
			metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", reason))))
	}
}

func transportReason(err error) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return reasonTimeout
	}
	return reasonConnection
}

// failed counts a failed scrape, logs it at most once per target per
// scrapeLogEvery and reports a recoverable error when the target starts
// failing.
func (s *vllmScraper) failed(ctx context.Context, t *vllmTarget, reason string, err error) {
	s.counters.failedScrapes.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		attribute.String("target", t.name), attribute.String("reason", reason))))
	if now := time.Now(); now.Sub(t.lastLogged) >= scrapeLogEvery {
		s.log.Warn("vllm scrape failed", zap.String("target", t.name), zap.String("reason", reason),
			zap.Int("failures_not_logged", t.suppressed), zap.Error(err))
		t.lastLogged, t.suppressed = now, 0
	} else {
		t.suppressed++
	}
	s.mu.Lock()
	first := !s.failing[t.url]
	s.failing[t.url] = true
	s.mu.Unlock()
	if first {
		componentstatus.ReportStatus(s.host, componentstatus.NewRecoverableErrorEvent(
			fmt.Errorf("vllm scrape of %s failed (%s): %w", t.name, reason, err)))
	}
}

// recovered reports the component OK again once no target is failing.
func (s *vllmScraper) recovered(t *vllmTarget) {
	s.mu.Lock()
	was := s.failing[t.url]
	delete(s.failing, t.url)
	allOK := was && len(s.failing) == 0
	s.mu.Unlock()
	if now := time.Now(); was && now.Sub(t.lastRecovered) >= scrapeLogEvery {
		s.log.Info("vllm scrape recovered", zap.String("target", t.name))
		t.lastRecovered = now
	}
	if allOK {
		componentstatus.ReportStatus(s.host, componentstatus.NewEvent(componentstatus.StatusOK))
	}
}
