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
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.uber.org/zap"
)

// maxDatagramBytes is the largest UDP payload; a datagram is read whole.
const maxDatagramBytes = 65507

// Datagrams that arrive together are handed to the pipeline together: after
// the first datagram of a batch, the listener goes on reading until
// hooks::udp::batch_window has passed or coalesceBytes are read, and packs
// each session's tokens of all of them into one record. At a high rate a
// hook client's datagram (8 KiB) holds about one token of each session it
// streams, so a record per session per datagram would be a record per
// token, and the per-record cost is most of the token path's. (An earlier
// version waited 100 µs for each next datagram: at a steady pace that timed
// out after every one.)
const coalesceBytes = 256 << 10

// maxUDPBatchWindow bounds hooks::udp::batch_window: the delay it adds to
// every event must stay far below the stall gap.
const maxUDPBatchWindow = 100 * time.Millisecond

// hooksUDPListener reads datagrams of NDJSON lines. It is fire-and-forget on
// the sender's side, so nothing here may stop it: bad datagrams and refused
// batches are counted and the loop goes on.
type hooksUDPListener struct {
	r      *tokenStreamReceiver
	obs    *receiverhelper.ObsReport
	conn   *net.UDPConn
	window time.Duration // hooks::udp::batch_window
	cancel context.CancelFunc
	done   sync.WaitGroup

	// oob receives the socket's drop count (Linux: SO_RXQ_OVFL); nil when
	// the kernel does not offer it. drops is the last count seen, owned by
	// the read loop.
	oob   []byte
	drops uint32
}

func startHooksUDP(cfg *UDPConfig, r *tokenStreamReceiver, host component.Host) (*hooksUDPListener, error) {
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{
		ReceiverID: r.settings.ID, Transport: "udp", ReceiverCreateSettings: r.settings,
	})
	if err != nil {
		return nil, err
	}
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
	r.logsLogger.Info("Token event hook listening", zap.String("transport", "udp"), zap.String("endpoint", conn.LocalAddr().String()))
	ctx, cancel := context.WithCancel(context.Background())
	l := &hooksUDPListener{r: r, obs: obs, conn: conn, window: cfg.BatchWindow, cancel: cancel}
	if enableDropCount(conn) {
		l.oob = make([]byte, dropsOOBBytes)
	}
	l.done.Add(1)
	go l.readLoop(ctx, host)
	return l, nil
}

func (l *hooksUDPListener) readLoop(ctx context.Context, host component.Host) {
	defer l.done.Done()
	buf := make([]byte, maxDatagramBytes+1)
	for {
		n, err := l.read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient read errors (e.g. ICMP-induced) must not stop the
			// listener; report and go on after a short pause so a persistent
			// error cannot spin.
			componentstatus.ReportStatus(host, componentstatus.NewRecoverableErrorEvent(err))
			l.r.logsLogger.Warn("UDP hook read failed", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if n == 0 {
			continue
		}
		first := time.Now()
		d := l.r.decoder()
		d.begin(first)
		d.add(buf[:n])
		closed := l.readMore(d, buf, first.Add(l.window), n)
		d.finish()
		// A refused batch is counted by consume; UDP has no one to tell.
		_ = l.r.consume(ctx, l.obs, d, transportUDP)
		l.r.release(d)
		if closed {
			return
		}
	}
}

// readMore adds to d the datagrams read until deadline, up to
// coalesceBytes in all (read counts those already in d). It reports
// whether the connection was closed meanwhile; any other read error is
// left to the next read of the loop.
func (l *hooksUDPListener) readMore(d *batchDecoder, buf []byte, deadline time.Time, read int) (closed bool) {
	if l.window <= 0 {
		return false
	}
	if err := l.conn.SetReadDeadline(deadline); err != nil {
		return errors.Is(err, net.ErrClosed)
	}
	defer func() { _ = l.conn.SetReadDeadline(time.Time{}) }()
	for read < coalesceBytes {
		n, err := l.read(buf)
		if err != nil {
			return errors.Is(err, net.ErrClosed)
		}
		if n > 0 {
			d.add(buf[:n])
			read += n
		}
	}
	return false
}

// read reads one datagram, waiting for it, and counts drops (countDrops).
func (l *hooksUDPListener) read(buf []byte) (int, error) {
	if l.oob == nil {
		n, _, err := l.conn.ReadFrom(buf)
		return n, err
	}
	n, oobn, _, _, err := l.conn.ReadMsgUDP(buf, l.oob)
	if err == nil {
		l.countDrops(l.oob[:oobn])
	}
	return n, err
}

// countDrops counts the datagrams the kernel dropped since the last one
// read, for want of receive buffer: the kernel attaches its count to the
// datagrams it queues, so drops are counted when the next datagram after
// them is read.
func (l *hooksUDPListener) countDrops(oob []byte) {
	if len(oob) == 0 {
		return
	}
	if total, ok := dropCount(oob); ok && total != l.drops {
		// uint32 arithmetic: right across the counter's wrap too.
		l.r.telemetry.ReceiverTokenStreamUDPDroppedDatagrams.Add(context.Background(), int64(total-l.drops))
		l.drops = total
	}
}

func (l *hooksUDPListener) shutdown() error {
	l.cancel()
	err := l.conn.Close()
	l.done.Wait()
	return err
}
