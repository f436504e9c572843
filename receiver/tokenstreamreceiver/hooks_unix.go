// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/internal/tokenparse"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/lograte"
)

// The Unix socket hook: an engine keeps one stream connection open and
// writes NDJSON lines as they come; the listener cuts the stream into
// batches by time (fillWindow, as the UDP listener does) and answers each
// batch on the same connection with one acknowledgement line:
//
//	{"accepted":N,"rejected":M,"refused":K,"errors":[{"line":L,"message":"..."}]}
//
// N+M+K are the non-blank lines the batch held, in the order written: the
// lines taken, the lines rejected (errors names the first ten, numbered
// from the connection's first line), the lines the pipeline refused. A
// client counts a line written as in flight until an acknowledgement covers
// it, and the lines no acknowledgement covered when the connection ends as
// failed: so a collector restart loses at most what was in flight, and
// the client counts it.

// unixReadBufferBytes is each connection's read buffer: room for several
// lines per read, and for the longest line allowed (see newUnixReadBuffer).
const unixReadBufferBytes = 64 << 10

// maxUnixConns bounds the connections open at once; one beyond it is
// closed at once (logged). An engine needs one.
const maxUnixConns = 1024

// ackWriteTimeout bounds the write of one acknowledgement: a client that
// does not read them would otherwise stop the connection's reads once the
// socket's send buffer is full. The connection is closed instead.
const ackWriteTimeout = time.Second

// hooksUnixListener accepts stream connections on a Unix domain socket.
type hooksUnixListener struct {
	sink   hookSink
	warn   *zap.Logger
	ln     *net.UnixListener
	path   string
	window time.Duration
	limits LimitsConfig

	mu    sync.Mutex
	conns map[*unixConn]struct{}
	// maxConns is maxUnixConns (a test lowers it).
	maxConns int
	closing  bool
	done     sync.WaitGroup
}

// startHooksUnix listens on cfg's socket, with the permissions resolved
// from cfg (UnixConfig.permissions).
func startHooksUnix(cfg *UnixConfig, perm unixPermissions, limits LimitsConfig, sink hookSink) (*hooksUnixListener, error) {
	// The socket's directory is made if missing (a hostPath of type
	// DirectoryOrCreate, a fresh emptyDir): the path names the socket.
	if err := makeSocketDir(filepath.Dir(cfg.Endpoint), perm); err != nil {
		return nil, fmt.Errorf("hooks::unix::endpoint: %w", err)
	}
	if err := removeStaleSocket(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("hooks::unix::endpoint: %w", err)
	}
	ln, err := listenUnix(cfg.Endpoint, perm)
	if err != nil {
		return nil, fmt.Errorf("hooks::unix: listen on %s: %w", cfg.Endpoint, err)
	}
	l := &hooksUnixListener{
		sink: sink, warn: lograte.OncePerMinute(sink.Logger()), ln: ln, path: cfg.Endpoint,
		window: cfg.BatchWindow, limits: limits, conns: map[*unixConn]struct{}{}, maxConns: maxUnixConns,
	}
	sink.Logger().Info("Token event hook listening", zap.String("transport", "unix"), zap.String("endpoint", cfg.Endpoint))
	l.done.Add(1)
	go l.acceptLoop()
	return l, nil
}

// makeSocketDir makes dir and the directories above it that are missing,
// each with the directory mode and group of perm. A directory that exists
// is left as it is: its permissions are its owner's (a hostPath, an
// emptyDir), and the socket's own mode restricts who may connect.
func makeSocketDir(dir string, perm unixPermissions) error {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		_, err := os.Lstat(d)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		if err := os.Mkdir(d, perm.directoryMode); err != nil {
			if errors.Is(err, fs.ErrExist) {
				continue // made by another process meanwhile: not ours
			}
			return err
		}
		// Exact, whatever the umask.
		if err := os.Chmod(d, perm.directoryMode); err != nil {
			return err
		}
		if err := chownGroup(d, perm.gid); err != nil {
			return err
		}
	}
	return nil
}

// listenUnix listens on a socket at path with the mode and group of perm.
func listenUnix(path string, perm unixPermissions) (*net.UnixListener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { presetSocketMode(fd, perm.socketMode) })
	}}
	l, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	ln := l.(*net.UnixListener)
	if err := os.Chmod(path, perm.socketMode); err != nil { //nolint:gosec // G703: the operator's own hooks::unix::endpoint
		_ = ln.Close()
		return nil, err
	}
	if err := chownGroup(path, perm.gid); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return ln, nil
}

// chownGroup gives path to group gid (-1: leaves it). Unless the collector
// may change any file's owner (root with CAP_CHOWN), it must be a member of
// the group.
func chownGroup(path string, gid int) error {
	if gid < 0 {
		return nil
	}
	if err := os.Lchown(path, -1, gid); err != nil {
		return fmt.Errorf("setting its group (socket_group) to %d: %w: the collector must be a member of the group, or root", gid, err)
	}
	return nil
}

// removeStaleSocket removes a socket file left by a collector that did not
// shut down (killed, crashed), so that a restart can listen again; a socket
// someone still listens on, or a file that is no socket, is an error.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("%s: another process listens on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s: checking whether the socket is stale: %w", path, err)
	}
	return os.Remove(path)
}

func (l *hooksUnixListener) acceptLoop() {
	defer l.done.Done()
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if closedConn(err) {
				return
			}
			// EMFILE and the like: go on after a pause, so that they
			// cannot spin.
			l.warn.Warn("Unix hook accept failed (logged at most once a minute)", zap.Error(err))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l.mu.Lock()
		if l.closing || len(l.conns) >= l.maxConns {
			closing, limit := l.closing, l.maxConns
			l.mu.Unlock()
			if !closing {
				l.sink.countRefusedConnections(1)
				l.warn.Warn("Unix hook connection closed at once: too many open (logged at most once a minute; counted in otelcol_receiver_token_stream_unix_refused_connections)", zap.Int("limit", limit))
			}
			_ = c.Close()
			continue
		}
		// Made only once taken: a connection's read buffer is 64 KiB.
		uc := newUnixConn(l, c)
		l.conns[uc] = struct{}{}
		l.done.Add(1)
		l.mu.Unlock()
		go uc.serve()
	}
}

// shutdown stops accepting, lets each connection hand over and acknowledge
// what it has read, and closes them; lines still unread in a socket buffer
// are not acknowledged, which tells their clients.
func (l *hooksUnixListener) shutdown() error {
	err := l.ln.Close()
	l.mu.Lock()
	l.closing = true
	for c := range l.conns {
		c.stop()
	}
	l.mu.Unlock()
	l.done.Wait()
	if closedConn(err) {
		err = nil
	}
	return err
}

// unixConn is one client's connection and its read state.
type unixConn struct {
	l       *hooksUnixListener
	c       *net.UnixConn
	lines   lineStream
	stopped atomic.Bool
	ack     []byte
	// clientGone is set once an acknowledgement could not be written for
	// the client closed: the lines still queued are read and counted, not
	// answered.
	clientGone bool
}

func newUnixConn(l *hooksUnixListener, c *net.UnixConn) *unixConn {
	return &unixConn{l: l, c: c, lines: newLineStream(l.limits.MaxLineBytes)}
}

// stop makes the connection's reads return at once, the one under way
// included; serve then hands over and acknowledges what it read.
func (u *unixConn) stop() {
	u.stopped.Store(true)
	_ = u.c.SetReadDeadline(time.Unix(1, 0))
}

func (u *unixConn) serve() {
	defer u.l.done.Done()
	defer func() {
		u.l.mu.Lock()
		delete(u.l.conns, u)
		u.l.mu.Unlock()
		_ = u.c.Close()
	}()
	for !u.stopped.Load() {
		n, err := u.lines.read(u.c)
		if n == 0 && err != nil {
			// The connection's end: EOF, a reset, or stop. At the
			// client's end a last line without its newline is read (see
			// streamEnded); cut by a stop, it is left unacknowledged, so
			// its client counts it failed.
			if u.streamEnded(err) && u.lines.pending() {
				u.handOver(time.Now(), func(d *batchDecoder) { u.lines.flushPartial(d) })
			}
			return
		}
		var end error
		u.handOver(time.Now(), func(d *batchDecoder) {
			u.lines.take(d)
			if err != nil {
				// The first read ended the stream already (data with its
				// EOF): no window to wait.
				end = err
			} else {
				end = fillWindow(u.c, d.observed, u.l.window, n, func() (int, error) {
					n, err := u.lines.read(u.c)
					u.lines.take(d)
					return n, err
				}, func() bool { return d.accepted+d.rejected >= u.l.limits.MaxLinesPerBatch })
			}
			if u.streamEnded(end) {
				u.lines.flushPartial(d)
			}
		})
		if end != nil {
			return
		}
	}
}

// streamEnded reports whether err, which ended a read, is the end of the
// client's stream rather than a stop: EOF, or a reset (ECONNRESET: a client
// that closed, or was killed, with an acknowledgement still unread). The
// kernel hands over every byte the client wrote before it reports either,
// so what was read is all there is: its whole lines are taken and a last
// line without its newline is judged as it is.
func (u *unixConn) streamEnded(err error) bool {
	return err != nil && !u.stopped.Load() && !errors.Is(err, os.ErrDeadlineExceeded)
}

// handOver runs fill on a new batch begun at first, hands the batch to the
// pipeline and acknowledges it. A batch that took no line (a blank line,
// or only part of one) is neither handed over nor acknowledged.
func (u *unixConn) handOver(first time.Time, fill func(d *batchDecoder)) {
	d := u.l.sink.decoder()
	defer u.l.sink.release(d)
	d.begin(first, false)
	fill(d)
	d.finish()
	ack, ok := deliverStreamBatch(u.l.sink, u.l.warn, d, u.ack[:0])
	if !ok || u.clientGone {
		return
	}
	u.ack = ack
	if err := u.c.SetWriteDeadline(time.Now().Add(ackWriteTimeout)); err == nil {
		_, err = u.c.Write(u.ack)
		switch {
		case err == nil, u.stopped.Load():
		case errors.Is(err, os.ErrDeadlineExceeded):
			u.l.warn.Warn("Unix hook client does not read its acknowledgements: connection closed (logged at most once a minute)", zap.Error(err))
			u.stop()
		default:
			// The client closed (EPIPE, a reset): what it wrote before is
			// still to read, up to the stream's end, with no answer.
			u.clientGone = true
		}
	}
}

// deliverStreamBatch hands a stream's batch d to the pipeline and appends
// its acknowledgement to ack; false, with nothing handed over, for a batch
// that took no line.
func deliverStreamBatch(sink hookSink, warn *zap.Logger, d *batchDecoder, ack []byte) ([]byte, bool) {
	if d.accepted+d.rejected == 0 {
		return ack, false
	}
	if d.rejected > 0 {
		warn.Warn("Unix hook rejected token event lines (logged at most once a minute; the client is told in its acknowledgement, every one is counted in otelcol_receiver_token_stream_rejected_events)",
			zap.Int("rejected", d.rejected), zap.Int("accepted", d.accepted), zap.Error(d.errs[0]))
	}
	// As with UDP, what was read is delivered even when shutting down.
	refused := 0
	if err := sink.consume(context.Background(), d); err != nil {
		refused = d.accepted
	}
	return appendAck(ack, d, refused), true
}

// unixAck is the JSON of an acknowledgement with errors; appendAck writes
// the common one, without, by hand.
type unixAck struct {
	Accepted int         `json:"accepted"`
	Rejected int         `json:"rejected"`
	Refused  int         `json:"refused"`
	Errors   []lineError `json:"errors"`
}

// appendAck appends the acknowledgement of batch d to b: refused of its
// accepted lines were refused by the pipeline.
func appendAck(b []byte, d *batchDecoder, refused int) []byte {
	if len(d.errs) == 0 {
		b = append(b, `{"accepted":`...)
		b = strconv.AppendInt(b, int64(d.accepted-refused), 10)
		b = append(b, `,"rejected":`...)
		b = strconv.AppendInt(b, int64(d.rejected), 10)
		b = append(b, `,"refused":`...)
		b = strconv.AppendInt(b, int64(refused), 10)
		return append(b, `,"errors":[]}`+"\n"...)
	}
	a := unixAck{Accepted: d.accepted - refused, Rejected: d.rejected, Refused: refused, Errors: make([]lineError, len(d.errs))}
	for i, e := range d.errs {
		a.Errors[i] = lineError{Line: e.Line, Message: e.FieldError.Error()}
	}
	j, _ := json.Marshal(&a)
	return append(append(b, j...), '\n')
}

// lineStream cuts a byte stream into NDJSON lines with a buffer of fixed
// size: the complete lines read go to a batch, the partial last one waits
// for its end. A line longer than the buffer is rejected when the buffer
// fills with it, and the rest of it skipped up to its newline: a client
// that never sends one costs a read a buffer and no memory.
type lineStream struct {
	buf    []byte
	n      int  // bytes in buf
	skip   bool // discarding the rest of an over-long line
	lineNo int  // lines of the stream ended so far
	// overlong is the error of a line over the buffer, set by read and
	// reported by the next take.
	overlong *tokenparse.LineError
	// maxLineBytes is hooks::limits::max_line_bytes, for the error.
	maxLineBytes int
}

// newLineStream sizes the buffer for the longest line allowed, its newline
// and a byte more: a line the buffer holds whole is judged by the parser,
// which states its length; a longer one by lineStream.
func newLineStream(maxLineBytes int) lineStream {
	return lineStream{buf: make([]byte, max(unixReadBufferBytes, maxLineBytes+2)), maxLineBytes: maxLineBytes}
}

// read reads once from r into the buffer and returns the bytes read.
func (s *lineStream) read(r io.Reader) (int, error) {
	if s.n == len(s.buf) {
		// Full of one line: reject it, skip to its end.
		s.lineNo++
		s.overlong = &tokenparse.LineError{Line: s.lineNo, FieldError: tokenevent.FieldError{
			Reason: fmt.Sprintf("line is longer than %d bytes, limit is %d", len(s.buf), s.maxLineBytes),
		}}
		s.n, s.skip = 0, true
	}
	n, err := r.Read(s.buf[s.n:])
	if s.skip && n > 0 {
		chunk := s.buf[s.n : s.n+n]
		j := bytes.IndexByte(chunk, '\n')
		if j < 0 {
			return n, err
		}
		s.skip = false
		m := copy(s.buf[s.n:], chunk[j+1:])
		s.n += m
		return n, err
	}
	s.n += n
	return n, err
}

// take adds the complete lines in the buffer to d and keeps the partial
// last one.
func (s *lineStream) take(d *batchDecoder) {
	if s.overlong != nil {
		d.reject(s.overlong)
		s.overlong = nil
	}
	j := bytes.LastIndexByte(s.buf[:s.n], '\n')
	if j < 0 {
		return
	}
	complete := s.buf[:j+1]
	d.lineBase = s.lineNo
	d.addLines(complete)
	s.lineNo += bytes.Count(complete, newline)
	s.n = copy(s.buf, s.buf[j+1:s.n])
}

// pending reports a partial line in the buffer (or an over-long line's
// error not yet reported).
func (s *lineStream) pending() bool { return s.overlong != nil || (s.n > 0 && !s.skip) }

// flushPartial adds the partial last line to d, at the stream's end: a
// JSON object whole but for its newline is taken, one cut short is
// rejected, its reason saying that the connection ended mid-line.
func (s *lineStream) flushPartial(d *batchDecoder) {
	s.take(d)
	if s.n > 0 && !s.skip {
		d.lineBase = s.lineNo
		d.parser.ParseBatch(s.buf[:s.n], 0, d.onEvent, func(e *tokenparse.LineError) {
			e.Reason += " (the connection ended before the line's newline)"
			d.onError(e)
		})
		s.lineNo++
		s.n = 0
	}
}

var newline = []byte{'\n'}
