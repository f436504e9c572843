// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/httpserve"
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

// confighttpDefaultBodyBytes is the body limit confighttp applies when
// max_request_body_size is 0.
const confighttpDefaultBodyBytes = 20 << 20

// hooksHTTPServer serves POST <path> with NDJSON token event batches. Every
// answer is JSON, a wrong path's and a bad encoding's included.
type hooksHTTPServer struct {
	httpserve.Server
	sink   hookSink
	path   string
	bodies sync.Pool // of *bytes.Buffer
	// limits are stated in the answer to a batch that broke one of them.
	limits hookLimits
}

func startHooksHTTP(ctx context.Context, cfg *HTTPConfig, limits LimitsConfig, sink hookSink, host component.Host, set component.TelemetrySettings) (*hooksHTTPServer, error) {
	bodyLimit := cfg.ServerConfig.MaxRequestBodySize
	if bodyLimit <= 0 {
		bodyLimit = confighttpDefaultBodyBytes
	}
	s := &hooksHTTPServer{sink: sink, path: cfg.Path, limits: hookLimits{
		MaxLinesPerBatch:   limits.MaxLinesPerBatch,
		MaxLineBytes:       limits.MaxLineBytes,
		MaxRequestBodySize: bodyLimit,
	}}
	s.bodies.New = func() any { return new(bytes.Buffer) }
	// confighttp answers a body it cannot decompress itself: in JSON too.
	onError := confighttp.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, msg string, status int) {
		writeResponse(w, status, &batchResponse{Error: msg})
	})
	if err := s.Serve(ctx, &cfg.ServerConfig, s, host, set, nil, onError); err != nil {
		return nil, fmt.Errorf("hooks::http: %w", err)
	}
	sink.Logger().Info("Token event hook listening", zap.String("transport", "http"), zap.String("endpoint", s.Addr.String()), zap.String("path", cfg.Path))
	return s, nil
}

// batchResponse is the JSON body of every answer to a batch.
type batchResponse struct {
	Accepted int         `json:"accepted"`
	Rejected int         `json:"rejected"`
	Errors   []lineError `json:"errors"`
	// Error says why the whole batch failed, when it did for a reason other
	// than its lines.
	Error string `json:"error,omitempty"`
	// Limits are present when the batch broke one (cut at
	// max_lines_per_batch, or over max_request_body_size), so that a
	// client can keep its next batches within them.
	Limits *hookLimits `json:"limits,omitempty"`
}

// hookLimits are the receiver's limits on a batch, named as its
// configuration keys.
type hookLimits struct {
	MaxLinesPerBatch   int   `json:"max_lines_per_batch"`
	MaxLineBytes       int   `json:"max_line_bytes"`
	MaxRequestBodySize int64 `json:"max_request_body_size"`
}

type lineError struct {
	Line    int    `json:"line"`
	Message string `json:"message"`
}

func (s *hooksHTTPServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != s.path {
		writeResponse(w, http.StatusNotFound, &batchResponse{Error: "no token event endpoint at " + req.URL.Path + ": POST batches to " + s.path})
		return
	}
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeResponse(w, http.StatusMethodNotAllowed, &batchResponse{Error: "method " + req.Method + " not allowed: POST an NDJSON batch"})
		return
	}
	if !ndjsonContentType(req.Header.Get("Content-Type")) {
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
			limits := s.limits
			limits.MaxRequestBodySize = mbe.Limit
			writeResponse(w, http.StatusRequestEntityTooLarge, &batchResponse{
				Error:  fmt.Sprintf("body larger than max_request_body_size (%d bytes)", mbe.Limit),
				Limits: &limits,
			})
			return
		}
		writeResponse(w, http.StatusBadRequest, &batchResponse{Error: "reading body: " + err.Error()})
		return
	}

	d := s.sink.decoder()
	defer s.sink.release(d)
	d.decode(body.Bytes(), time.Now())
	err := s.sink.consume(req.Context(), d)
	if err == nil && d.rejected == 0 && d.accepted > 0 {
		writeAccepted(w, d.accepted)
		return
	}
	resp := &batchResponse{Accepted: d.accepted, Rejected: d.rejected, Errors: make([]lineError, len(d.errs))}
	for i, e := range d.errs {
		resp.Errors[i] = lineError{Line: e.Line, Message: e.FieldError.Error()}
	}
	// Every non-blank line of the body counts once, an unread one too: more
	// than the limit means the body was cut at it.
	if d.accepted+d.rejected > s.limits.MaxLinesPerBatch {
		resp.Limits = &s.limits
	}
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

// ndjsonContentType reports whether a batch's Content-Type is one of
// ndjsonMediaTypes. The bare media type, what clients send, is looked up
// first: parsing costs allocations on every request.
func ndjsonContentType(ct string) bool {
	if ndjsonMediaTypes[ct] {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && ndjsonMediaTypes[mt]
}

// jsonContentType is the Content-Type header of every answer, shared so that
// setting it allocates nothing.
var jsonContentType = []string{"application/json"}

// writeAccepted answers a batch taken whole: the batchResponse of
// writeResponse, byte for byte, written without encoding/json. It is every
// answer of a healthy pipeline, so its cost is paid per request.
func writeAccepted(w http.ResponseWriter, accepted int) {
	var buf [64]byte
	b := append(buf[:0], `{"accepted":`...)
	b = strconv.AppendInt(b, int64(accepted), 10)
	b = append(b, `,"rejected":0,"errors":[]}`+"\n"...)
	writeJSON(w, http.StatusOK, b)
}

func writeResponse(w http.ResponseWriter, status int, resp *batchResponse) {
	if resp.Errors == nil {
		resp.Errors = []lineError{}
	}
	b, _ := json.Marshal(resp)
	writeJSON(w, status, append(b, '\n'))
}

// writeJSON writes an answer's JSON body b with its length announced (no
// chunked encoding).
func writeJSON(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
