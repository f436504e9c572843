package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.uber.org/zap"
)

// ndjsonMediaTypes are the content types a batch may be posted with.
var ndjsonMediaTypes = map[string]bool{
	"application/x-ndjson":    true,
	"application/ndjson":      true,
	"application/jsonl":       true,
	"application/x-jsonlines": true,
	"application/json":        true,
	"application/jsonlines":   true,
}

// retryAfterSeconds is what a 503 asks the client to wait before retrying.
const retryAfterSeconds = "1"

// hooksHTTPServer serves POST <path> with NDJSON token event batches.
type hooksHTTPServer struct {
	r      *tokenStreamReceiver
	obs    *receiverhelper.ObsReport
	server *http.Server
	addr   net.Addr // where it listens; tests start it on port 0
	done   sync.WaitGroup
	bodies sync.Pool // of *bytes.Buffer
}

func startHooksHTTP(ctx context.Context, cfg *HTTPConfig, r *tokenStreamReceiver, host component.Host) (*hooksHTTPServer, error) {
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{
		ReceiverID: r.settings.ID, Transport: "http", ReceiverCreateSettings: r.settings,
	})
	if err != nil {
		return nil, err
	}
	s := &hooksHTTPServer{r: r, obs: obs}
	s.bodies.New = func() any { return new(bytes.Buffer) }
	mux := http.NewServeMux()
	mux.Handle(cfg.Path, s)
	s.server, err = cfg.ServerConfig.ToServer(ctx, host.GetExtensions(), r.settings.TelemetrySettings, mux)
	if err != nil {
		return nil, fmt.Errorf("hooks::http: %w", err)
	}
	ln, err := cfg.ServerConfig.ToListener(ctx)
	if err != nil {
		return nil, fmt.Errorf("hooks::http: listen on %s: %w", cfg.ServerConfig.NetAddr.Endpoint, err)
	}
	s.addr = ln.Addr()
	r.settings.Logger.Info("Token event hook listening", zap.String("transport", "http"), zap.String("endpoint", ln.Addr().String()), zap.String("path", cfg.Path))
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		if err := s.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			componentstatus.ReportStatus(host, componentstatus.NewFatalErrorEvent(err))
		}
	}()
	return s, nil
}

func (s *hooksHTTPServer) shutdown(ctx context.Context) error {
	err := s.server.Shutdown(ctx)
	s.done.Wait()
	return err
}

// batchResponse is the JSON body of every answer to a batch.
type batchResponse struct {
	Accepted int         `json:"accepted"`
	Rejected int         `json:"rejected"`
	Errors   []lineError `json:"errors"`
	// Error says why the whole batch failed, when it did for a reason other
	// than its lines.
	Error string `json:"error,omitempty"`
}

type lineError struct {
	Line    int    `json:"line"`
	Message string `json:"message"`
}

func (s *hooksHTTPServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeResponse(w, http.StatusMethodNotAllowed, &batchResponse{Error: "method " + req.Method + " not allowed: POST an NDJSON batch"})
		return
	}
	if mt, _, err := mime.ParseMediaType(req.Header.Get("Content-Type")); err != nil || !ndjsonMediaTypes[mt] {
		writeResponse(w, http.StatusUnsupportedMediaType, &batchResponse{
			Error: fmt.Sprintf("content type %q not supported: send application/x-ndjson", req.Header.Get("Content-Type")),
		})
		return
	}

	body := s.bodies.Get().(*bytes.Buffer)
	defer s.putBody(body)
	body.Reset()
	if _, err := body.ReadFrom(req.Body); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			writeResponse(w, http.StatusRequestEntityTooLarge, &batchResponse{Error: fmt.Sprintf("body larger than max_request_body_size (%d bytes)", mbe.Limit)})
			return
		}
		writeResponse(w, http.StatusBadRequest, &batchResponse{Error: "reading body: " + err.Error()})
		return
	}

	d := s.r.decoder()
	defer s.r.release(d)
	d.decode(body.Bytes(), time.Now())
	resp := &batchResponse{Accepted: d.accepted, Rejected: d.rejected, Errors: make([]lineError, len(d.errs))}
	for i, e := range d.errs {
		resp.Errors[i] = lineError{Line: e.Line, Message: e.FieldError.Error()}
	}
	err := s.r.consume(req.Context(), s.obs, d, transportHTTP)
	if d.accepted == 0 {
		if d.rejected == 0 {
			resp.Error = "body holds no token events"
		}
		writeResponse(w, http.StatusBadRequest, resp)
		return
	}
	if err != nil {
		resp.Accepted = 0
		resp.Error = "pipeline refused the batch: " + err.Error()
		status := http.StatusServiceUnavailable
		if consumererror.IsPermanent(err) {
			status = http.StatusBadRequest
		} else {
			w.Header().Set("Retry-After", retryAfterSeconds)
		}
		writeResponse(w, status, resp)
		return
	}
	writeResponse(w, http.StatusOK, resp)
}

// maxPooledBody keeps one unusually large request from pinning its buffer.
const maxPooledBody = 4 << 20

func (s *hooksHTTPServer) putBody(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBody {
		s.bodies.Put(b)
	}
}

func writeResponse(w http.ResponseWriter, status int, resp *batchResponse) {
	if resp.Errors == nil {
		resp.Errors = []lineError{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(resp)
}
