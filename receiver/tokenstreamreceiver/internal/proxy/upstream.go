// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxy"

import (
	"bufio"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/proxyconn"
)

// directUpstream is the observed paths' HTTP/1.1 client: the request and
// the response head as net/http writes and reads them, then the body read
// on the handler's goroutine straight from the connection.
//
// Why not http.Transport: it reads each connection on a goroutine of its
// own and hands every read to the handler's through a pipe, so each SSE
// event woke two goroutines, and each open stream held two goroutines and
// two buffers on the upstream side (a third of the proxy's CPU per event
// over nginx's, and most of its memory per stream). Here a stream holds a
// connection and one small reader.
//
// It serves plain-HTTP upstreams that confighttp would reach directly;
// anything its transport would add (TLS, auth, middlewares, a proxy,
// request compression, a connection limit) keeps the observed paths on
// the transport (directEligible).
type directUpstream struct {
	addr string // host:port to dial
	// headers are proxy::upstream::headers but Host, set on every request
	// in place of the request's own; host is a configured Host ("": the
	// request's).
	headers http.Header
	host    string
	// header bounds the wait for the response head once the request is
	// written; idle each wait for the body's next bytes (0: unbounded).
	header, idle time.Duration
	// readBuffer is the size of each exchange's reader: the response head
	// must fit in it line by line, the body goes through it.
	readBuffer int
	// heads are the readers of response heads, given back when the body
	// is read without them (dechunkedBody).
	heads   sync.Pool
	pool    connPool
	retries retryCounter
}

// directEligible reports whether the observed requests to upstream can
// skip cfg's transport: a plain-HTTP upstream reached directly, with
// nothing confighttp would put between the request and the connection but
// static headers.
func directEligible(cfg *confighttp.ClientConfig, upstream *url.URL) bool {
	if upstream.Scheme != "http" || cfg.Auth.HasValue() || len(cfg.Middlewares) > 0 || cfg.ProxyURL != "" ||
		cfg.Compression.IsCompressed() || cfg.MaxConnsPerHost > 0 || cfg.Cookies.HasValue() {
		return false
	}
	// The environment's proxy, as http.DefaultTransport reads it.
	proxied, err := http.ProxyFromEnvironment(&http.Request{URL: upstream})
	return err == nil && proxied == nil
}

func newDirectUpstream(cfg *confighttp.ClientConfig, upstream *url.URL, header, idle time.Duration) *directUpstream {
	addr := upstream.Host
	if upstream.Port() == "" {
		addr = net.JoinHostPort(upstream.Hostname(), "80")
	}
	d := &directUpstream{addr: addr, header: header, idle: idle, readBuffer: cfg.ReadBufferSize}
	if d.readBuffer <= 0 {
		d.readBuffer = 4 << 10 // http.Transport's
	}
	// As confighttp's header round tripper: a configured Host is the
	// request's host, every other header replaces the request's own.
	for _, h := range cfg.Headers {
		if http.CanonicalHeaderKey(h.Name) == "Host" {
			d.host = string(h.Value)
			continue
		}
		if d.headers == nil {
			d.headers = http.Header{}
		}
		d.headers.Set(h.Name, string(h.Value))
	}
	// http.Transport's keep-alive settings, as confighttp sets them.
	// confighttp's Unmarshal folds keepalive:: into these deprecated fields,
	// which stay its source of truth through their deprecation window; a
	// Keepalive set after it (programmatically) takes precedence, as in
	// ToClient.
	maxIdle := cfg.MaxIdleConns                                                                                      //nolint:staticcheck // see above
	d.pool.maxIdle, d.pool.timeout, d.pool.off = cfg.MaxIdleConnsPerHost, cfg.IdleConnTimeout, cfg.DisableKeepAlives //nolint:staticcheck // see above
	if ka := cfg.Keepalive.Get(); ka != nil {
		maxIdle = ka.MaxIdleConns
		d.pool.maxIdle, d.pool.timeout, d.pool.off = ka.MaxIdleConnsPerHost, ka.IdleConnTimeout, false
	}
	if d.pool.maxIdle <= 0 {
		d.pool.maxIdle = http.DefaultMaxIdleConnsPerHost
	}
	if maxIdle > 0 {
		// One host: the transport's overall bound applies to it too.
		d.pool.maxIdle = min(d.pool.maxIdle, maxIdle)
	}
	return d
}

// requestWriters are the buffered writers the requests are written
// through (head and body in one system call when the body is small).
var requestWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}

// copyBuffers carry the request bodies into the chunked writer.
var copyBuffers = sync.Pool{New: func() any { return new([4 << 10]byte) }}

// RoundTrip sends req (its body chunked: the usage member may have been
// added) and reads the response head. Its errors are the transport's: a
// timeout is a net.Error whose Timeout is true. A request whose kept-alive
// connection failed before any byte of the answer is sent again, once, on
// a new connection (retry.go).
func (d *directUpstream) RoundTrip(req *http.Request) (*http.Response, error) {
	body := replayBodyOf(req)
	var c net.Conn
	if body.fits() {
		// A body that could not be sent again goes on a new connection,
		// which has no close to race.
		c = d.pool.get()
	}
	var src io.Reader
	if body != nil {
		src = body
	}
	if c == nil {
		resp, _, err := d.exchange(req, src, nil)
		return resp, err
	}
	body.keep()
	resp, early, err := d.exchange(req, src, c)
	if err == nil || !early || !retryable(req.Context(), err) {
		body.settle()
		return resp, err
	}
	if !body.rewind() {
		d.retries.add(retryBodyTooLarge)
		body.settle()
		return nil, err
	}
	resp, _, err = d.exchange(req, src, nil)
	body.settle()
	d.retries.retried(err)
	return resp, err
}

// exchange sends req with body on c (nil: a new connection) and reads the
// response head. early: it failed before any byte of the answer came.
func (d *directUpstream) exchange(req *http.Request, body io.Reader, c net.Conn) (_ *http.Response, early bool, _ error) {
	ctx := req.Context()
	var err error
	if c == nil {
		c, err = proxyconn.Dial(ctx, "tcp", d.addr)
	}
	if err != nil {
		return nil, true, err
	}
	// Canceling the request closes the connection, which ends any read
	// or write on it.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	fail := func(err error) (*http.Response, bool, error) {
		if stop() {
			c.Close()
		}
		if ctx.Err() != nil {
			return nil, false, fmt.Errorf("proxy: upstream request: %w", context.Cause(ctx))
		}
		return nil, early, err
	}
	werr, bodyErr := d.writeRequest(c, req, body)
	if bodyErr != nil || (werr != nil && ctx.Err() != nil) {
		// The client's body failed (too large, too slow, gone): the
		// request cannot be finished, the connection cannot be reused.
		return fail(cmp.Or(bodyErr, werr))
	}
	// As http.Transport's ResponseHeaderTimeout, the wait starts once the
	// request is written: a slow upload is the client's, not the upstream's.
	if d.header > 0 {
		_ = c.SetReadDeadline(time.Now().Add(d.header))
	}
	br, _ := d.heads.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(c, d.readBuffer)
	} else {
		br.Reset(c)
	}
	if _, err := br.Peek(1); err != nil {
		br.Reset(nil)
		d.heads.Put(br)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fail(errHeaderTimeout)
		}
		// No byte of the answer came: the upstream closed the connection,
		// or the request's write failed.
		early = true
		return fail(cmp.Or(werr, err))
	}
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(br, req)
		if err != nil {
			if werr != nil {
				// The upstream neither read the whole request nor answered.
				return fail(werr)
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fail(errHeaderTimeout)
			}
			return fail(err)
		}
		// An interim answer (100 Continue, 103 Early Hints) is not the
		// response; http.Transport skips it too.
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		break
	}
	_ = c.SetReadDeadline(time.Time{})
	// The request (its header, its scanned body) is not needed any more;
	// a stream would hold it for its whole length.
	resp.Request = nil
	b := &directBody{d: d, c: c, stop: stop, ctx: ctx, rc: resp.Body, reusable: werr == nil && !resp.Close && !d.pool.off}
	resp.Body = b
	gzipped := resp.Header.Get("Content-Encoding") == "gzip" && resp.StatusCode != http.StatusNoContent && req.Method != http.MethodHead
	if resp.StatusCode == http.StatusOK && req.Method != http.MethodHead && !gzipped &&
		len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked" {
		// A stream (an SSE answer is chunked): its body read straight into
		// the relay's buffer, the head's reader given back.
		var prefix []byte
		if n := br.Buffered(); n > 0 {
			buffered, _ := br.Peek(n)
			prefix = append([]byte(nil), buffered...)
		}
		br.Reset(nil)
		d.heads.Put(br)
		b.dechunked = newDechunkedBody(c, prefix)
		b.rc = io.NopCloser(b.dechunked)
	}
	if gzipped {
		// The proxy asked for gzip as http.Transport does (it drops the
		// client's Accept-Encoding: it reads the stream), so it undoes it.
		resp.Body = &gzipBody{body: b}
		resp.Header.Del("Content-Encoding")
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
		resp.Uncompressed = true
	}
	return resp, false, nil
}

// writeRequest writes req's head and body, chunked. bodyErr is a failure
// to read the body, err one to write to c.
func (d *directUpstream) writeRequest(c net.Conn, req *http.Request, body io.Reader) (err, bodyErr error) {
	w := requestWriters.Get().(*bufio.Writer)
	w.Reset(c)
	defer func() {
		w.Reset(nil)
		requestWriters.Put(w)
	}()
	_, _ = fmt.Fprintf(w, "%s %s HTTP/1.1\r\nHost: %s\r\n", req.Method, req.URL.RequestURI(), cmp.Or(d.host, req.Host, req.URL.Host))
	for k, v := range d.headers {
		req.Header[k] = v
	}
	_ = req.Header.Write(w)
	if req.Header.Get("User-Agent") == "" {
		// http.Transport's default, which the pass-through paths send too
		// when the client set none.
		_, _ = w.WriteString("User-Agent: Go-http-client/1.1\r\n")
	}
	if req.Header.Get("Accept-Encoding") == "" {
		_, _ = w.WriteString("Accept-Encoding: gzip\r\n")
	}
	if d.pool.off {
		_, _ = w.WriteString("Connection: close\r\n")
	}
	if body == nil {
		_, _ = w.WriteString("\r\n")
		return w.Flush(), nil
	}
	_, _ = w.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	cw := httputil.NewChunkedWriter(w)
	src := &readErrorReader{r: body}
	// io.Copy would allocate 32 KiB per request: neither side has a
	// ReadFrom or WriteTo.
	cb := copyBuffers.Get().(*[4 << 10]byte)
	_, err = io.CopyBuffer(cw, src, cb[:])
	copyBuffers.Put(cb)
	if err != nil {
		return err, src.err
	}
	_ = cw.Close()
	_, _ = w.WriteString("\r\n")
	return w.Flush(), nil
}

// readErrorReader keeps the error of r's reads apart from the writer's.
type readErrorReader struct {
	r   io.Reader
	err error
}

func (e *readErrorReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		e.err = err
	}
	return n, err
}

// directBody is a response body read from the connection; the connection
// goes back to the pool when the body was read whole and may be reused.
type directBody struct {
	d    *directUpstream
	c    net.Conn
	stop func() bool
	ctx  context.Context
	rc   io.ReadCloser
	// dechunked is rc's reader when the body is read without net/http's
	// (a chunked 200 answer); nil otherwise.
	dechunked *dechunkedBody
	reusable  bool
	eof       bool
	// deadline is the read deadline set last (for idle).
	deadline time.Time
	// sock is c's socket while the event loop reads it (detach).
	sock *proxyconn.Socket
}

func (b *directBody) Read(p []byte) (int, error) {
	if b.d.idle > 0 {
		// Re-set at most every idle/16, as the client's send deadline
		// (sendDeadline): each wait gets between idle and 1/16 more.
		if now := time.Now(); b.deadline.Sub(now) < b.d.idle {
			b.deadline = now.Add(b.d.idle + b.d.idle/deadlineSlack)
			_ = b.c.SetReadDeadline(b.deadline)
		}
	}
	n, err := b.rc.Read(p)
	return n, b.readError(err)
}

// readError is the error of a read of the body that failed with err.
func (b *directBody) readError(err error) error {
	switch {
	case err == nil, errors.Is(err, proxyconn.ErrWouldBlock):
	case errors.Is(err, io.EOF):
		b.eof = true
	case b.ctx.Err() != nil:
		err = b.cancelled()
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = errIdleTimeout
	}
	return err
}

// cancelled is the error of a read of the body once its exchange was
// cancelled.
func (b *directBody) cancelled() error {
	return fmt.Errorf("proxy: upstream body: %w", context.Cause(b.ctx))
}

// detach takes the body's socket out of the runtime's poller, for the
// event loop (relayloop.go) to watch and tryRead to read; reattach puts
// it back. The body must be dechunked.
func (b *directBody) detach() error {
	sock, err := proxyconn.Detach(b.c)
	if err != nil {
		return err
	}
	b.sock, b.dechunked.r = sock, sock
	return nil
}

// tryRead is a Read of a detached body that never waits: with nothing to
// read it returns proxyconn.ErrWouldBlock. stream_idle_timeout is the
// event loop's to keep.
func (b *directBody) tryRead(p []byte) (int, error) {
	n, err := b.dechunked.Read(p)
	return n, b.readError(err)
}

// reattach makes a connection of the detached socket again, for Read and
// Close, and for the exchange's end to close it (as exchange set for the
// first). Cancelled already, the socket is closed instead: the exchange
// closed its connection.
func (b *directBody) reattach() {
	sock := b.sock
	if sock == nil {
		return
	}
	b.sock, b.dechunked.r = nil, b.c
	if !b.stop() {
		sock.Close()
		return
	}
	c, err := sock.Attach()
	if err != nil {
		// Lost: the reads fail on the closed connection, which no one
		// closes again.
		b.stop = func() bool { return false }
		return
	}
	b.c, b.dechunked.r, b.deadline = c, c, time.Time{}
	b.stop = context.AfterFunc(b.ctx, func() { c.Close() })
}

func (b *directBody) Close() error {
	if b.c == nil {
		return nil
	}
	c := b.c
	b.c = nil
	if !b.stop() {
		return nil // cancelled: the connection is closed
	}
	if b.eof && b.reusable && (b.dechunked == nil || b.dechunked.reusable()) {
		if b.d.idle > 0 {
			_ = c.SetReadDeadline(time.Time{})
		}
		b.d.pool.put(c)
		return nil
	}
	return c.Close()
}

// gzipBody undoes the upstream's gzip, as http.Transport does when it
// asked for it.
type gzipBody struct {
	body *directBody
	zr   *gzip.Reader
	err  error
}

func (g *gzipBody) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.zr == nil {
		if g.zr, g.err = gzip.NewReader(g.body); g.err != nil {
			return 0, g.err
		}
	}
	n, err := g.zr.Read(p)
	if errors.Is(err, io.EOF) {
		// The gzip stream may end before the body's last bytes (its
		// chunked terminator): read them, so that the connection is
		// reused.
		_, _ = io.Copy(io.Discard, g.body)
	}
	return n, err
}

func (g *gzipBody) Close() error { return g.body.Close() }

// connPool holds the upstream's kept-alive connections, newest last.
type connPool struct {
	mu      sync.Mutex
	idle    []idleConn
	maxIdle int
	timeout time.Duration // 0: kept until the upstream closes them
	off     bool          // keep-alive disabled
	closed  bool
}

type idleConn struct {
	c     net.Conn
	since time.Time
}

// get is the newest connection still usable, or nil.
func (p *connPool) get() net.Conn {
	for {
		p.mu.Lock()
		if len(p.idle) == 0 {
			p.mu.Unlock()
			return nil
		}
		ic := p.idle[len(p.idle)-1]
		p.idle[len(p.idle)-1] = idleConn{}
		p.idle = p.idle[:len(p.idle)-1]
		p.mu.Unlock()
		if (p.timeout <= 0 || time.Since(ic.since) < p.timeout) && proxyconn.Idle(ic.c) {
			return ic.c
		}
		ic.c.Close()
	}
}

func (p *connPool) put(c net.Conn) {
	now := time.Now()
	p.mu.Lock()
	// The oldest are first: those past the idle timeout go.
	var expired []net.Conn
	if p.timeout > 0 {
		n := 0
		for n < len(p.idle) && now.Sub(p.idle[n].since) >= p.timeout {
			expired = append(expired, p.idle[n].c)
			n++
		}
		if n > 0 {
			p.idle = append(p.idle[:0], p.idle[n:]...)
		}
	}
	keep := !p.closed && len(p.idle) < p.maxIdle
	if keep {
		p.idle = append(p.idle, idleConn{c: c, since: now})
	}
	p.mu.Unlock()
	if !keep {
		c.Close()
	}
	for _, e := range expired {
		e.Close()
	}
}

// close closes the idle connections; those in use are closed when their
// exchange ends.
func (p *connPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, ic := range idle {
		ic.c.Close()
	}
}
