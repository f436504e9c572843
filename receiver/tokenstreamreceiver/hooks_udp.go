// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.uber.org/zap"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/lograte"
)

// hooksUDPListener reads datagrams of NDJSON lines. It is fire-and-forget on
// the sender's side, so nothing here may stop it: bad datagrams and refused
// batches are counted and the loop goes on.
type hooksUDPListener struct {
	sink hookSink
	// warn says at the default level that lines were rejected: no one
	// else can (UDP has no answer), and the counter alone goes unseen.
	warn   *zap.Logger
	conn   *net.UDPConn
	window time.Duration // hooks::udp::batch_window
	// batch reads conn several datagrams per system call (recvmmsg on
	// Linux, one elsewhere) into msgs.
	batch  batchReader
	msgs   []ipv4.Message
	cancel context.CancelFunc
	done   sync.WaitGroup

	// drops is the socket's drop count last seen (Linux: SO_RXQ_OVFL, in
	// each message's OOB when the kernel offers it), owned by the read loop.
	drops uint32
}

// udpReadBatch is how many datagrams one read system call may take: a
// hook's datagram is 8 KiB at most by default, so a batch's worth of them
// in a few calls, not one per datagram.
const udpReadBatch = 8

// batchReader is what x/net's ipv4 and ipv6 packet connections share.
type batchReader interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
}

// newBatchReader reads c through x/net, for the address family it is bound
// to (a dual-stack socket is IPv6).
func newBatchReader(c *net.UDPConn) batchReader {
	if a, ok := c.LocalAddr().(*net.UDPAddr); ok && a.IP.To4() != nil {
		return ipv4.NewPacketConn(c)
	}
	return ipv6.NewPacketConn(c)
}

func startHooksUDP(cfg *UDPConfig, sink hookSink, host component.Host) (*hooksUDPListener, error) {
	pc, err := net.ListenPacket("udp", cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("hooks::udp: listen on %s: %w", cfg.Endpoint, err)
	}
	conn := pc.(*net.UDPConn)
	if cfg.SocketBufferSize > 0 {
		if err := conn.SetReadBuffer(cfg.SocketBufferSize); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("hooks::udp::socket_buffer_size: %w", err)
		}
	}
	sink.Logger().Info("Token event hook listening", zap.String("transport", "udp"), zap.String("endpoint", conn.LocalAddr().String()))
	ctx, cancel := context.WithCancel(context.Background())
	l := &hooksUDPListener{
		sink: sink, warn: lograte.OncePerMinute(sink.Logger()), conn: conn, window: cfg.BatchWindow, cancel: cancel,
		batch: newBatchReader(conn), msgs: make([]ipv4.Message, udpReadBatch),
	}
	counted := enableDropCount(conn)
	for i := range l.msgs {
		l.msgs[i].Buffers = [][]byte{make([]byte, maxDatagramBytes+1)}
		if counted {
			l.msgs[i].OOB = make([]byte, dropsOOBBytes)
		}
	}
	l.done.Add(1)
	go l.readLoop(ctx, host)
	return l, nil
}

func (l *hooksUDPListener) readLoop(ctx context.Context, host component.Host) {
	defer l.done.Done()
	for {
		n, err := l.batch.ReadBatch(l.msgs, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient read errors (e.g. ICMP-induced) must not stop the
			// listener; report and go on after a short pause so a persistent
			// error cannot spin.
			componentstatus.ReportStatus(host, componentstatus.NewRecoverableErrorEvent(err))
			l.sink.Logger().Warn("UDP hook read failed", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		first := time.Now()
		d := l.sink.decoder()
		// Datagrams overtake each other: an end read before the session's
		// last token would make that token late, so within the batch each
		// session's events go in time order.
		d.begin(first, true)
		read := l.add(d, n)
		if read == 0 { // empty datagrams only
			l.sink.release(d)
			continue
		}
		closed := l.readMore(d, first, read)
		d.finish()
		if d.rejected > 0 {
			l.warn.Warn("UDP hook rejected token event lines (logged at most once a minute; every one is counted in otelcol_receiver_token_stream_rejected_events)",
				zap.Int("rejected", d.rejected), zap.Int("accepted", d.accepted), zap.Error(d.errs[0]))
		}
		// A refused batch is counted by consume; UDP has no one to tell.
		// The hand-over is not cancelled with the read loop: datagrams read
		// before shutdown are delivered, and shutdown waits for them.
		_ = l.sink.consume(context.WithoutCancel(ctx), d)
		l.sink.release(d)
		if closed {
			return
		}
	}
}

// readMore adds to d the datagrams read within the batch window (see
// fillWindow; read counts the bytes already in d). It reports whether the
// connection was closed meanwhile; any other read error is left to the next
// read of the loop.
func (l *hooksUDPListener) readMore(d *batchDecoder, first time.Time, read int) (closed bool) {
	err := fillWindow(l.conn, first, l.window, read, func() (int, error) {
		n, err := l.batch.ReadBatch(l.msgs, 0)
		if err != nil {
			return 0, err
		}
		return l.add(d, n), nil
	}, func() bool { return false })
	return closedConn(err)
}

// add adds to d the first n datagrams of msgs, the last read's, and
// returns their bytes. It counts the datagrams the kernel dropped since
// the last one read, for want of receive buffer: the kernel attaches its
// count to the datagrams it queues, so drops are counted when the next
// datagram after them is read.
func (l *hooksUDPListener) add(d *batchDecoder, n int) int {
	read := 0
	for i := range n {
		m := &l.msgs[i]
		if m.NN > 0 {
			if total, ok := dropCount(m.OOB[:m.NN]); ok && total != l.drops {
				// uint32 arithmetic: right across the counter's wrap too.
				l.sink.countDroppedDatagrams(int64(total - l.drops))
				l.drops = total
			}
		}
		if m.N > 0 {
			d.add(m.Buffers[0][:m.N])
			read += m.N
		}
	}
	return read
}

func (l *hooksUDPListener) shutdown() error {
	l.cancel()
	err := l.conn.Close()
	l.done.Wait()
	return err
}
