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
// a datagram, the listener goes on reading for as long as the next one
// arrives within coalesceWait, up to coalesceBytes in all. Under load a
// pipeline call then carries many datagrams instead of one (a hook client
// sends at most 8 KiB in one), and its cost per call is shared; when the
// hooks are quiet a datagram waits coalesceWait at most. The records are
// the same as if each datagram went alone: packing does not span datagrams.
const (
	coalesceWait  = 100 * time.Microsecond
	coalesceBytes = 256 << 10
)

// hooksUDPListener reads datagrams of NDJSON lines. It is fire-and-forget on
// the sender's side, so nothing here may stop it: bad datagrams and refused
// batches are counted and the loop goes on.
type hooksUDPListener struct {
	r      *tokenStreamReceiver
	obs    *receiverhelper.ObsReport
	conn   net.PacketConn
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func startHooksUDP(cfg *UDPConfig, r *tokenStreamReceiver, host component.Host) (*hooksUDPListener, error) {
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{
		ReceiverID: r.settings.ID, Transport: "udp", ReceiverCreateSettings: r.settings,
	})
	if err != nil {
		return nil, err
	}
	conn, err := net.ListenPacket("udp", cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("hooks::udp: listen on %s: %w", cfg.Endpoint, err)
	}
	if cfg.SocketBufferSize > 0 {
		if err := conn.(*net.UDPConn).SetReadBuffer(cfg.SocketBufferSize); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("hooks::udp::socket_buffer_size: %w", err)
		}
	}
	r.logsLogger.Info("Token event hook listening", zap.String("transport", "udp"), zap.String("endpoint", conn.LocalAddr().String()))
	ctx, cancel := context.WithCancel(context.Background())
	l := &hooksUDPListener{r: r, obs: obs, conn: conn, cancel: cancel}
	l.done.Add(1)
	go l.readLoop(ctx, host)
	return l, nil
}

func (l *hooksUDPListener) readLoop(ctx context.Context, host component.Host) {
	defer l.done.Done()
	buf := make([]byte, maxDatagramBytes+1)
	for {
		n, _, err := l.conn.ReadFrom(buf)
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

// readQueued adds to d the datagrams that follow within coalesceWait of
// each other, up to coalesceBytes. It reports whether the connection was
// closed meanwhile; any other read error is left to the next blocking read.
func (l *hooksUDPListener) readQueued(d *batchDecoder, buf []byte) (closed bool) {
	defer func() { _ = l.conn.SetReadDeadline(time.Time{}) }()
	for total := 0; total < coalesceBytes; {
		if err := l.conn.SetReadDeadline(time.Now().Add(coalesceWait)); err != nil {
			return errors.Is(err, net.ErrClosed)
		}
		n, _, err := l.conn.ReadFrom(buf)
		if err != nil {
			return errors.Is(err, net.ErrClosed)
		}
		if n > 0 {
			d.add(buf[:n])
			total += n
		}
	}
	return false
}

func (l *hooksUDPListener) shutdown() error {
	l.cancel()
	err := l.conn.Close()
	l.done.Wait()
	return err
}
