// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"errors"
	"net"
	"os"
	"time"
)

// Both socket hooks (UDP datagrams, Unix stream connections) form their
// batches by time: after the first bytes of a batch, the listener goes on
// reading until its batch_window has passed or coalesceBytes are read, and
// packs each session's tokens of all of them into one record. At a high
// rate a hook client's write holds about one token of each session it
// streams, so a record per session per write would be a record per token,
// and the per-record cost is most of the token path's. (An earlier version
// waited 100 µs for each next datagram: at a steady pace that timed out
// after every one.)
const coalesceBytes = 256 << 10

// maxBatchWindow bounds every batch_window: the delay it adds to every
// event must stay far below the stall gap.
const maxBatchWindow = 100 * time.Millisecond

// deadlineReader is the part of a socket the batch window needs.
type deadlineReader interface {
	SetReadDeadline(t time.Time) error
}

// fillWindow goes on reading into the batch begun at first until window
// has passed, readMore has read coalesceBytes in all (read counts those
// already in the batch) or full says the batch is full. readMore reads once
// (blocking until the read deadline) and returns the bytes it added. It
// returns the read error that ended the window, nil when the window or a
// bound ended it: the caller decides what a closed socket or an EOF means.
func fillWindow(conn deadlineReader, first time.Time, window time.Duration, read int, readMore func() (int, error), full func() bool) error {
	if window <= 0 {
		return nil
	}
	if err := conn.SetReadDeadline(first.Add(window)); err != nil {
		return err
	}
	defer func() { _ = conn.SetReadDeadline(time.Time{}) }()
	for read < coalesceBytes && !full() {
		n, err := readMore()
		read += n
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil
			}
			return err
		}
	}
	return nil
}

// closedConn reports whether err says the socket was closed.
func closedConn(err error) bool { return errors.Is(err, net.ErrClosed) }
