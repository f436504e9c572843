package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pipeline"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/otelcol-llm/otelcol-llm/internal/earlystop"
	"github.com/otelcol-llm/otelcol-llm/internal/sharedcomponent"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenparse"
	"github.com/otelcol-llm/otelcol-llm/internal/tokenrecord"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
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
	cfg         *Config
	settings    receiver.Settings // without the collector's otelcol.signal
	next        consumer.Logs     // nil unless the receiver is in a logs pipeline
	nextMetrics consumer.Metrics  // nil unless the receiver is in a metrics pipeline
	telemetry   *metadata.TelemetryBuilder
	batches     sync.Pool // of *batchDecoder

	// The loggers of the sources of each signal, which name it.
	logsLogger, metricsLogger *zap.Logger

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
	set.TelemetrySettings = withoutSignal(set.TelemetrySettings)
	tel, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	r := &tokenStreamReceiver{
		cfg: cfg, settings: set, next: next, telemetry: tel,
		logsLogger:    set.Logger.With(zap.String(signalKey, pipeline.SignalLogs.String())),
		metricsLogger: set.Logger.With(zap.String(signalKey, pipeline.SignalMetrics.String())),
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
		l, err := startHooksUnix(u, r.cfg.Hooks.Limits, sink)
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

// lineErrorsKept is how many line errors a batch keeps for its response; the
// rest are only counted, except the one that cuts the batch at its line
// limit, always kept.
const lineErrorsKept = 10

// batchDecoder turns one request body or datagram into log records. It is
// pooled: its parser keeps the session ID intern table warm between batches.
type batchDecoder struct {
	parser   *tokenparse.Parser
	writer   *tokenrecord.RecordWriter
	maxLines int

	logs plog.Logs
	// observed is when the batch began.
	observed time.Time
	// lineBase is added to the line numbers of the errors: a stream's
	// lines are numbered from its first, across batches.
	lineBase int
	accepted int
	rejected int
	// truncated counts the bodies cut at maxLines.
	truncated int
	errs      []*tokenparse.LineError
	// records is the batch's record slice; lastRecords how many records
	// the decoder's previous batch held, the room a batch's slice is made
	// with: grown from empty, it was reallocated a dozen times per batch
	// of a thousand records.
	records     plog.LogRecordSlice
	lastRecords int
}

// decode parses body into d.logs, counting accepted and rejected lines and
// keeping the first lineErrorsKept errors.
func (d *batchDecoder) decode(body []byte, observed time.Time) {
	d.begin(observed, false)
	d.add(body)
	d.finish()
}

// begin starts a batch that add fills with one or more bodies (UDP
// datagrams read together). ordered: the bodies may have overtaken each
// other (datagrams), so each session's events are put in time order
// before they go (tokenrecord's SetOrdered).
func (d *batchDecoder) begin(observed time.Time, ordered bool) {
	d.logs = plog.NewLogs()
	d.observed, d.lineBase = observed, 0
	d.accepted, d.rejected, d.truncated, d.errs = 0, 0, 0, d.errs[:0]
	sl := d.logs.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	sl.Scope().SetName(metadata.ScopeName)
	d.records = sl.LogRecords()
	d.records.EnsureCapacity(d.lastRecords)
	d.writer.Reset(d.records, pcommon.NewTimestampFromTime(observed))
	d.writer.SetOrdered(ordered)
}

// add parses one body into the batch; line limits and numbers are per body.
// A session's tokens are packed across the bodies of the batch.
func (d *batchDecoder) add(body []byte) {
	d.parser.ParseBatch(body, d.maxLines, d.onEvent, d.onError)
}

// finish completes the batch's records (the packed ones are written last).
func (d *batchDecoder) finish() {
	d.writer.Flush()
	d.lastRecords = d.records.Len()
}

// addLines parses lines of a stream into the batch: no line limit (a
// stream's batch ends at it instead), and line numbers from lineBase on.
func (d *batchDecoder) addLines(lines []byte) {
	d.parser.ParseBatch(lines, 0, d.onEvent, d.onError)
}

func (d *batchDecoder) onEvent(ev *tokenevent.Event) {
	d.accepted++
	d.writer.Append(ev)
}

func (d *batchDecoder) onError(e *tokenparse.LineError) {
	e.Line += d.lineBase
	d.reject(e)
}

// reject counts a rejected line and keeps its error, numbered already.
func (d *batchDecoder) reject(e *tokenparse.LineError) {
	d.rejected += 1 + e.Unread
	if e.Unread > 0 {
		d.truncated++
	}
	// The error cutting the batch is always kept: the client must learn
	// that the rest was not read.
	if len(d.errs) < lineErrorsKept || e.Unread > 0 {
		d.errs = append(d.errs, e)
	}
}

// release drops the batch's records and returns d to the pool.
func (r *tokenStreamReceiver) release(d *batchDecoder) {
	d.logs, d.records = plog.Logs{}, plog.LogRecordSlice{}
	d.writer.Reset(plog.LogRecordSlice{}, 0)
	r.batches.Put(d)
}

func (r *tokenStreamReceiver) decoder() *batchDecoder { return r.batches.Get().(*batchDecoder) }

// hookSink is what a hook endpoint is given by the receiver: pooled batch
// decoders, the hand-over of a decoded batch to the pipeline, the one
// counter of its own (UDP's) and the logs logger.
type hookSink interface {
	decoder() *batchDecoder
	release(d *batchDecoder)
	consume(ctx context.Context, d *batchDecoder) error
	countDroppedDatagrams(n int64)
	countRefusedConnections(n int64)
	Logger() *zap.Logger
}

// logsSink is how a log source hands its records to the logs pipeline,
// with the standard receiver observability and the token event counters
// around the call. It is what the hooks (hookSink) and the proxy
// (proxy.Sink) are given.
type logsSink struct {
	r         *tokenStreamReceiver
	obs       *receiverhelper.ObsReport
	transport transportKind
	format    string // of the standard receiver metrics: ndjson or sse
}

func (r *tokenStreamReceiver) newLogsSink(transport transportKind, format string) (*logsSink, error) {
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{
		ReceiverID: r.settings.ID, Transport: transport.String(), ReceiverCreateSettings: r.settings,
	})
	if err != nil {
		return nil, err
	}
	return &logsSink{r: r, obs: obs, transport: transport, format: format}, nil
}

// ConsumeEvents hands records holding events token events to the pipeline.
func (s *logsSink) ConsumeEvents(ctx context.Context, logs plog.Logs, events int) error {
	ctx = s.obs.StartLogsOp(ctx)
	n := logs.LogRecordCount()
	err := s.r.next.ConsumeLogs(ctx, logs)
	s.obs.EndLogsOp(ctx, s.format, n, err)
	attrs := transportAttrs[s.transport]
	if err != nil {
		s.r.telemetry.ReceiverTokenStreamRefusedEvents.Add(ctx, int64(events), attrs)
		s.r.logsLogger.Debug("pipeline refused token events", zap.Stringer("transport", s.transport), zap.Int("events", events), zap.Error(err))
		return err
	}
	s.r.telemetry.ReceiverTokenStreamAcceptedEvents.Add(ctx, int64(events), attrs)
	return nil
}

func (s *logsSink) decoder() *batchDecoder { return s.r.decoder() }

func (s *logsSink) release(d *batchDecoder) { s.r.release(d) }

// consume hands a decoded batch to the pipeline, counting its rejected
// lines and whether it was cut.
func (s *logsSink) consume(ctx context.Context, d *batchDecoder) error {
	attrs := transportAttrs[s.transport]
	if d.rejected > 0 {
		s.r.telemetry.ReceiverTokenStreamRejectedEvents.Add(ctx, int64(d.rejected), attrs)
	}
	if d.truncated > 0 {
		s.r.telemetry.ReceiverTokenStreamTruncatedBatches.Add(ctx, int64(d.truncated), attrs)
	}
	if cut := d.parser.TakeCuts(); cut > 0 {
		s.r.telemetry.ReceiverTokenStreamTruncatedValues.Add(ctx, int64(cut), attrs)
	}
	if d.accepted == 0 {
		return nil
	}
	return s.ConsumeEvents(ctx, d.logs, d.accepted)
}

func (s *logsSink) countDroppedDatagrams(n int64) {
	s.r.telemetry.ReceiverTokenStreamUDPDroppedDatagrams.Add(context.Background(), n)
}

func (s *logsSink) countRefusedConnections(n int64) {
	s.r.telemetry.ReceiverTokenStreamUnixRefusedConnections.Add(context.Background(), n)
}

func (s *logsSink) Counters() proxy.Counters {
	t := s.r.telemetry
	return proxy.Counters{
		RefusedRequests:     t.ReceiverTokenStreamProxyRefusedRequests,
		PassthroughFailures: t.ReceiverTokenStreamProxyPassthroughFailures,
		OversizedEvents:     t.ReceiverTokenStreamProxyOversizedEvents,
		DroppedEvents:       t.ReceiverTokenStreamProxyDroppedEvents,
		StalledStreams:      t.ReceiverTokenStreamProxyStalledStreams,
		CutStreams:          t.ReceiverTokenStreamProxyCutStreams,
		UpstreamRetries:     t.ReceiverTokenStreamProxyUpstreamRetries,
		TruncatedValues:     t.ReceiverTokenStreamTruncatedValues,
	}
}

func (s *logsSink) Logger() *zap.Logger { return s.r.logsLogger }

// metricsSink is how the vllm scraper hands what it reads to the metrics
// pipeline, with the standard receiver observability around the call.
type metricsSink struct {
	r   *tokenStreamReceiver
	obs *receiverhelper.ObsReport
}

func (s *metricsSink) ConsumeMetrics(ctx context.Context, md pmetric.Metrics) error {
	n := md.DataPointCount()
	ctx = s.obs.StartMetricsOp(ctx)
	err := s.r.nextMetrics.ConsumeMetrics(ctx, md)
	s.obs.EndMetricsOp(ctx, "prometheus", n, err)
	return err
}

func (s *metricsSink) counters() scrapeCounters {
	t := s.r.telemetry
	return scrapeCounters{
		invalidDataPoints: t.ReceiverTokenStreamInvalidDataPoints,
		skippedFamilies:   t.ReceiverTokenStreamSkippedFamilies,
		failedScrapes:     t.ReceiverTokenStreamFailedScrapes,
	}
}

func (s *metricsSink) Logger() *zap.Logger { return s.r.metricsLogger }

func (r *tokenStreamReceiver) startVLLMScraper(ctx context.Context, cfg *VLLMConfig, host component.Host) (*vllmScraper, error) {
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{
		ReceiverID: r.settings.ID, Transport: "http", ReceiverCreateSettings: r.settings,
	})
	if err != nil {
		return nil, err
	}
	return startVLLMScraper(ctx, cfg, &metricsSink{r: r, obs: obs}, host, r.settings.TelemetrySettings)
}

// startProxy starts the proxy as cfg says; it hands what it observes to
// the logs pipeline.
func (r *tokenStreamReceiver) startProxy(ctx context.Context, cfg *ProxyConfig, host component.Host) (*proxy.Server, error) {
	upstream, err := url.Parse(cfg.Upstream.ClientConfig.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("proxy::upstream::endpoint: %w", err)
	}
	if cfg.Upstream.ClientConfig.Timeout > 0 {
		r.logsLogger.Warn("proxy::upstream::timeout is deprecated and now bounds only the wait for response headers; use proxy::upstream::response_header_timeout")
	}
	sink, err := r.newLogsSink(transportProxy, "sse")
	if err != nil {
		return nil, err
	}
	headers, _ := cfg.headerAttributes(0) // checked by Validate
	return proxy.Start(ctx, &proxy.Config{
		Server: cfg.ServerConfig, Client: cfg.Upstream.ClientConfig, Upstream: upstream, Engine: engineName(upstream),
		ResponseHeaderTimeout: cfg.Upstream.headerTimeout(), StreamIdleTimeout: cfg.Upstream.StreamIdleTimeout,
		ClientBodyTimeout: cfg.ClientBodyTimeout, ClientSendTimeout: cfg.ClientSendTimeout,
		DrainTimeout: cfg.DrainTimeout, MaxStreams: cfg.MaxStreams, EventQueueSize: cfg.EventQueueSize,
		StallMaxGap: cfg.Stall.MaxGap, StallMinTokens: int64(cfg.Stall.MinTokens), HeaderAttributes: headers,
	}, sink, host, r.settings.TelemetrySettings)
}

type transportKind int

const (
	transportHTTP transportKind = iota
	transportUDP
	transportProxy
	transportUnix
	transportKinds
)

func (t transportKind) String() string { return [...]string{"http", "udp", "proxy", "unix"}[t] }

// transportAttrs are the attribute sets of the token event counters, one a
// transport, built once: they are on every batch's path. The counters count
// token events, not the log records the standard receiver metrics count
// (several token events of one session are packed into one record).
var transportAttrs = func() (attrs [transportKinds]metric.MeasurementOption) {
	for k := range transportKinds {
		attrs[k] = metric.WithAttributeSet(attribute.NewSet(attribute.String("transport", k.String())))
	}
	return attrs
}()

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
