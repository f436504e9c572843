// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"errors"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pipeline"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/otelcol-llm/otelcol-llm/internal/earlystop"
	"github.com/otelcol-llm/otelcol-llm/internal/sharedcomponent"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenparse"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"
)

// tokenStreamReceiver runs the configured sources: the hook endpoints and the
// proxy hand the token events they receive to the logs consumer as log
// records, the vllm scraper hands the engine metrics it reads to the metrics
// consumer.
//
// The logs and metrics instances of one component share one receiver (the
// otlp receiver's pattern): the factory returns the same *tokenStreamReceiver
// for both signals, each registering its consumer, and Start and Shutdown run
// once through the shared component.
type tokenStreamReceiver struct {
	// outlets are the consumers, telemetry and loggers its sources' sinks
	// hand their output to.
	outlets
	cfg *Config
	// sources is cfg as the proxy and the hooks take it, read once.
	sources resolvedSources

	// shared runs Start and Shutdown once for all signals; nil when the
	// receiver was built directly (tests).
	shared *sharedcomponent.Component[*sharedReceiver]

	http  *hooksHTTPServer
	udp   *hooksUDPListener
	unix  *hooksUnixListener
	proxy *proxy.Server
	vllm  *vllmScraper

	// unregisterEarlyStop takes the receiver off earlystop's list: the
	// token_session processor stops the receiver before itself, so that
	// the proxy drains into a processor that still runs.
	unregisterEarlyStop func()
}

// receivers holds the receiver each component configuration shares between
// its logs and metrics instances.
var receivers = sharedcomponent.NewMap[*Config, *sharedReceiver]()

// sharedReceiver is what the shared component starts and stops once.
type sharedReceiver struct{ r *tokenStreamReceiver }

func (s *sharedReceiver) Start(ctx context.Context, host component.Host) error {
	return s.r.start(ctx, host)
}

func (s *sharedReceiver) Shutdown(ctx context.Context) error { return s.r.shutdown(ctx) }

// loadOrCreateReceiver returns the receiver shared by the instances of cfg,
// creating it for the first one.
func loadOrCreateReceiver(cfg *Config, set receiver.Settings) (*tokenStreamReceiver, error) {
	c, err := receivers.LoadOrStore(cfg, func() (*sharedReceiver, error) {
		r, err := newTokenStreamReceiver(cfg, set, nil)
		if err != nil {
			return nil, err
		}
		return &sharedReceiver{r: r}, nil
	})
	if err != nil {
		return nil, err
	}
	r := c.Unwrap().r
	r.shared = c
	return r, nil
}

func newTokenStreamReceiver(cfg *Config, set receiver.Settings, next consumer.Logs) (*tokenStreamReceiver, error) {
	sources, errs := cfg.resolve()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	set.TelemetrySettings = withoutSignal(set.TelemetrySettings)
	tel, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	r := &tokenStreamReceiver{
		outlets: outlets{
			settings: set, next: next, telemetry: tel,
			logsLogger:    set.Logger.With(zap.String(signalKey, pipeline.SignalLogs.String())),
			metricsLogger: set.Logger.With(zap.String(signalKey, pipeline.SignalMetrics.String())),
		},
		cfg: cfg, sources: sources,
	}
	limits := cfg.Hooks.Limits
	r.batches.New = func() any {
		return &batchDecoder{
			parser:   tokenparse.NewParser(limits.parserLimits()),
			writer:   tokenrecord.NewRecordWriter(),
			maxLines: limits.MaxLinesPerBatch,
		}
	}
	return r, nil
}

// Start starts the receiver once, however many pipelines it is in.
func (r *tokenStreamReceiver) Start(ctx context.Context, host component.Host) error {
	if r.shared != nil {
		return r.shared.Start(ctx, host)
	}
	return r.start(ctx, host)
}

// Shutdown stops the receiver once and releases the shared instance, so a new
// one can be created for the same configuration.
func (r *tokenStreamReceiver) Shutdown(ctx context.Context) error {
	if r.shared != nil {
		return r.shared.Shutdown(ctx)
	}
	return r.shutdown(ctx)
}

// start starts the sources of the signals that have a consumer: hooks and
// proxy for logs, the vllm scraper for metrics.
func (r *tokenStreamReceiver) start(ctx context.Context, host component.Host) error {
	r.unregisterEarlyStop = earlystop.Register(r.Shutdown)
	logSources := r.cfg.Hooks.HTTP.HasValue() || r.cfg.Hooks.UDP.HasValue() || r.cfg.Hooks.Unix.HasValue() || r.cfg.Proxy.HasValue()
	switch {
	case r.next == nil && logSources:
		r.settings.Logger.Warn("hooks or proxy configured but the receiver is in no logs pipeline: they are not started")
	case r.next != nil && !logSources:
		r.settings.Logger.Warn("the receiver is in a logs pipeline but neither hooks nor proxy is configured: it emits no logs")
	}
	switch {
	case r.nextMetrics == nil && r.cfg.VLLM.HasValue():
		r.settings.Logger.Warn("vllm configured but the receiver is in no metrics pipeline: nothing is scraped")
	case r.nextMetrics != nil && !r.cfg.VLLM.HasValue():
		r.settings.Logger.Warn("the receiver is in a metrics pipeline but vllm is not configured: it emits no metrics")
	}
	if r.next != nil {
		if err := r.startLogSources(ctx, host); err != nil {
			return err
		}
	}
	if v := r.cfg.VLLM.Get(); v != nil && r.nextMetrics != nil {
		s, err := r.startVLLMScraper(ctx, v, host)
		if err != nil {
			return errors.Join(err, r.shutdown(ctx))
		}
		r.vllm = s
	}
	return nil
}

func (r *tokenStreamReceiver) startLogSources(ctx context.Context, host component.Host) error {
	if h := r.cfg.Hooks.HTTP.Get(); h != nil {
		sink, err := r.newLogsSink(transportHTTP, "ndjson")
		if err != nil {
			return err
		}
		srv, err := startHooksHTTP(ctx, h, r.cfg.Hooks.Limits, sink, host, r.settings.TelemetrySettings)
		if err != nil {
			return err
		}
		r.http = srv
	}
	if u := r.cfg.Hooks.UDP.Get(); u != nil {
		sink, err := r.newLogsSink(transportUDP, "ndjson")
		if err != nil {
			return errors.Join(err, r.shutdown(ctx))
		}
		l, err := startHooksUDP(u, sink, host)
		if err != nil {
			return errors.Join(err, r.shutdown(ctx))
		}
		r.udp = l
	}
	if u := r.cfg.Hooks.Unix.Get(); u != nil {
		sink, err := r.newLogsSink(transportUnix, "ndjson")
		if err != nil {
			return errors.Join(err, r.shutdown(ctx))
		}
		l, err := startHooksUnix(u, r.sources.unix, r.cfg.Hooks.Limits, sink)
		if err != nil {
			return errors.Join(err, r.shutdown(ctx))
		}
		r.unix = l
	}
	if p := r.cfg.Proxy.Get(); p != nil {
		srv, err := r.startProxy(ctx, p, host)
		if err != nil {
			return errors.Join(err, r.shutdown(ctx))
		}
		r.proxy = srv
	}
	return nil
}

func (r *tokenStreamReceiver) shutdown(ctx context.Context) error {
	if r.unregisterEarlyStop != nil {
		r.unregisterEarlyStop()
		r.unregisterEarlyStop = nil
	}
	defer r.telemetry.Shutdown()
	var errs []error
	if r.vllm != nil {
		r.vllm.shutdown()
		r.vllm = nil
	}
	if r.http != nil {
		errs = append(errs, r.http.Shutdown(ctx))
		r.http = nil
	}
	if r.udp != nil {
		errs = append(errs, r.udp.shutdown())
		r.udp = nil
	}
	if r.unix != nil {
		errs = append(errs, r.unix.shutdown())
		r.unix = nil
	}
	if r.proxy != nil {
		errs = append(errs, r.proxy.Shutdown(ctx))
		r.proxy = nil
	}
	return errors.Join(errs...)
}

func (r *tokenStreamReceiver) startVLLMScraper(ctx context.Context, cfg *VLLMConfig, host component.Host) (*vllmScraper, error) {
	sink, err := r.newMetricsSink()
	if err != nil {
		return nil, err
	}
	return startVLLMScraper(ctx, cfg, sink, host, r.settings.TelemetrySettings)
}

// startProxy starts the proxy as cfg says, with what resolve read from it;
// it hands what it observes to the logs pipeline.
func (r *tokenStreamReceiver) startProxy(ctx context.Context, cfg *ProxyConfig, host component.Host) (*proxy.Server, error) {
	if cfg.Upstream.ClientConfig.Timeout > 0 {
		r.logsLogger.Warn("proxy::upstream::timeout is deprecated and now bounds only the wait for response headers; use proxy::upstream::response_header_timeout")
	}
	sink, err := r.newLogsSink(transportProxy, "sse")
	if err != nil {
		return nil, err
	}
	return proxy.Start(ctx, r.sources.proxy, sink, host, r.settings.TelemetrySettings)
}

// signalKey is the attribute the collector adds to a component's telemetry
// to name the pipeline signal it was created for.
const signalKey = "otelcol.signal"

// withoutSignal drops the otelcol.signal the collector injected in ts: the
// logs and metrics instances share this receiver, created with the settings
// of whichever came first, so the signal would be wrong for the other
// (hooks logging as metrics). The otlp receiver does the same with a helper
// internal to the collector; the interfaces are those of the collector's
// injecting logger core and providers.
func withoutSignal(ts component.TelemetrySettings) component.TelemetrySettings {
	ts.Logger = ts.Logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		if d, ok := c.(attributeDropper[zapcore.Core]); ok {
			return d.DropInjectedAttributes(signalKey)
		}
		return c
	}))
	if d, ok := ts.MeterProvider.(attributeDropper[metric.MeterProvider]); ok {
		ts.MeterProvider = d.DropInjectedAttributes(signalKey)
	}
	if d, ok := ts.TracerProvider.(attributeDropper[trace.TracerProvider]); ok {
		ts.TracerProvider = d.DropInjectedAttributes(signalKey)
	}
	return ts
}

type attributeDropper[T any] interface {
	DropInjectedAttributes(attrs ...string) T
}
