// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
)

// The header policy of both paths (RFC 9110, section 7.6.1): the
// hop-by-hop fields, those the Connection field names and
// Proxy-Authorization (the proxy's own credentials, were it to ask for any)
// are not forwarded, either way. Upstream, the client's address is appended
// to X-Forwarded-For, X-Forwarded-Host and X-Forwarded-Proto say what the
// client asked for, and Host is the upstream's (as nginx's proxy_pass does:
// an upstream behind a virtual host or TLS needs its own name). Forwarded
// is dropped rather than left unchecked: the X-Forwarded-* fields say the
// same, from the proxy.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// notForwarded are the request fields the proxy sets itself: the
// forwarding fields on both paths (setForwardingFields); on the observed
// paths (observedOnly) also the body's length (the usage member may be
// added), Accept-Encoding (the proxy reads the stream, so the transport
// negotiates its own compression), the trace context (the upstream's
// parent is the session span) and the stall breaker's field.
var notForwarded = map[string]bool{
	"Forwarded": true, "X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true,
}

// StallBreakerHeader is the request field that turns the breaker off for
// one request ("off") or leaves it as configured ("on"). It is addressed to
// the proxy and not forwarded upstream.
const StallBreakerHeader = "X-Otelcol-Llm-Stall-Breaker"

var observedOnly = map[string]bool{
	"Content-Length": true, "Accept-Encoding": true, "Traceparent": true, "Tracestate": true,
	// Addressed to the proxy (its stall breaker), not to the engine.
	StallBreakerHeader: true,
}

// connectionNamed is the set of fields in's Connection field names.
func connectionNamed(h http.Header) map[string]bool {
	var named map[string]bool
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				if named == nil {
					named = map[string]bool{}
				}
				named[textproto.CanonicalMIMEHeaderKey(f)] = true
			}
		}
	}
	return named
}

// forwardedRequestHeader is the header of the upstream request made for
// in on an observed path: what httputil.ReverseProxy does on the others.
func forwardedRequestHeader(in *http.Request) http.Header {
	named := connectionNamed(in.Header)
	out := make(http.Header, len(in.Header)+3)
	for k, vs := range in.Header {
		if hopHeaders[k] || named[k] || notForwarded[k] || observedOnly[k] {
			continue
		}
		out[k] = append([]string(nil), vs...)
	}
	setForwardingFields(out, in)
	return out
}

// setForwardingFields sets the X-Forwarded-* fields of the upstream
// request made for in, on both paths.
func setForwardingFields(out http.Header, in *http.Request) {
	out.Del("Forwarded")
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := in.Header["X-Forwarded-For"]; len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		out["X-Forwarded-For"] = []string{ip}
	} else {
		out.Del("X-Forwarded-For")
	}
	out["X-Forwarded-Host"] = []string{in.Host}
	proto := "http"
	if in.TLS != nil {
		proto = "https"
	}
	out["X-Forwarded-Proto"] = []string{proto}
}

// copyResponseHeader copies the upstream's response fields but the
// hop-by-hop ones, which were about the upstream's connection.
func copyResponseHeader(dst, src http.Header) {
	named := connectionNamed(src)
	for k, vs := range src {
		if !hopHeaders[k] && !named[k] {
			dst[k] = vs
		}
	}
}

// parseTraceContext reads a W3C traceparent: the caller's trace and span
// become the session's trace and parent. Without a valid one, a new trace
// starts.
func parseTraceContext(h http.Header) (trace pcommon.TraceID, parent pcommon.SpanID, state string) {
	tp := h.Get("traceparent")
	// version-traceid-parentid-flags: 2+1+32+1+16+1+2
	if len(tp) >= 55 && tp[2] == '-' && tp[35] == '-' && tp[52] == '-' && tp[:2] != "ff" {
		_, err1 := hex.Decode(trace[:], []byte(tp[3:35]))
		_, err2 := hex.Decode(parent[:], []byte(tp[36:52]))
		if err1 == nil && err2 == nil && !trace.IsEmpty() && !parent.IsEmpty() {
			// Several tracestate fields are one list (W3C Trace Context).
			return trace, parent, strings.Join(h.Values("tracestate"), ",")
		}
	}
	_, _ = rand.Read(trace[:])
	return trace, pcommon.SpanID{}, ""
}

// traceparent is the W3C header naming span as the parent, sampled.
func traceparent(trace pcommon.TraceID, span pcommon.SpanID) string {
	var b [55]byte
	copy(b[:], "00-")
	hex.Encode(b[3:35], trace[:])
	b[35] = '-'
	hex.Encode(b[36:52], span[:])
	copy(b[52:], "-01")
	return string(b[:])
}

// proxyError is the body of an answer the proxy gives itself, in the shape
// of OpenAI's (and vLLM's) error responses, so that clients' SDKs read it.
type proxyError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// Error types of the answers the proxy gives itself (and of the sessions it
// ends so, when it opened one).
const (
	errUpstreamUnreachable = "upstream_unreachable"
	errUpstreamTimeout     = "upstream_timeout"
	// errBodyTooLarge and errBodyTimeout are the client's fault: the proxy
	// answers 413 or 408 and opens no session, so that the engine's error
	// rate does not carry them.
	errBodyTooLarge = "request_too_large"
	errBodyTimeout  = "request_timeout"
	// errTooManyStreams and errShuttingDown are the proxy's own 503s: no
	// session, the engine is not blamed.
	errTooManyStreams = "too_many_streams"
	errShuttingDown   = "shutting_down"
	// errBadStallHeader: the request's StallBreakerHeader is neither on nor
	// off; answered 400 before anything reaches the upstream, no session.
	errBadStallHeader = "invalid_request_error"
)

var proxyErrorMessages = map[string]string{
	errBodyTooLarge:        "the request body is larger than the proxy's max_request_body_size",
	errBodyTimeout:         "the request body stalled for longer than the proxy's client_body_timeout",
	errUpstreamTimeout:     "the upstream sent no response headers in time",
	errUpstreamUnreachable: "the upstream could not be reached",
	errTooManyStreams:      "the proxy has proxy::max_streams requests open; retry later",
	errShuttingDown:        "the proxy is shutting down; retry",
	errBadStallHeader:      "X-Otelcol-LLM-Stall-Breaker: want on or off",
}

func writeProxyError(w http.ResponseWriter, status int, errType string) {
	var e proxyError
	e.Error.Message, e.Error.Type, e.Error.Code = proxyErrorMessages[errType], errType, status
	if e.Error.Message == "" {
		e.Error.Message = http.StatusText(status)
	}
	body, _ := json.Marshal(&e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
