package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.uber.org/zap"
)

// maxDatagramBytes is the largest UDP payload; a datagram is read whole.
const maxDatagramBytes = 65507

// Datagrams that arrive together are handed to the pipeline together: after
// a datagram, the listener also takes those already queued behind it, up to
// coalesceBytes in all, without waiting for more (Linux: non-blocking reads
// on the socket). Under load a pipeline call then carries many datagrams
// instead of one (a hook client sends at most 8 KiB in one), and its cost
// per call is shared; a datagram never waits for the next. An earlier
// version waited up to 100 µs for one more: at a steady pace that wait timed
// out after every datagram, and the timer and its wake-ups cost more than
// the coalescing saved. The records are the same as if each datagram went
// alone: packing does not span datagrams.
const coalesceBytes = 256 << 10

// hooksUDPListener reads datagrams of NDJSON lines. It is fire-and-forget on
// the sender's side, so nothing here may stop it: bad datagrams and refused
// batches are counted and the loop goes on.
type hooksUDPListener struct {
	r      *tokenStreamReceiver
	obs    *receiverhelper.ObsReport
	conn   *net.UDPConn
	raw    syscall.RawConn // conn's, for the reads that must not wait
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
	raw, err := conn.SyscallConn()
	if err != nil {
		cancel()
		_ = conn.Close()
		return nil, fmt.Errorf("hooks::udp: %w", err)
	}
	l := &hooksUDPListener{r: r, obs: obs, conn: conn, raw: raw, cancel: cancel}
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
		d := l.r.decoder()
		d.begin(time.Now())
		d.add(buf[:n])
		closed := l.readQueued(d, buf)
		// A refused batch is counted by consume; UDP has no one to tell.
		_ = l.r.consume(ctx, l.obs, d, transportUDP)
		l.r.release(d)
		if closed {
			return
		}
	}
}

// readQueued adds to d the datagrams already queued on the socket, up to
// coalesceBytes. It reports whether the connection was closed meanwhile.
func (l *hooksUDPListener) readQueued(d *batchDecoder, buf []byte) (closed bool) {
	for total := 0; total < coalesceBytes; {
		n, ok, err := l.readQueuedDatagram(buf)
		if err != nil {
			return errors.Is(err, net.ErrClosed)
		}
		if !ok {
			return false
		}
		if n > 0 {
			d.add(buf[:n])
			total += n
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
