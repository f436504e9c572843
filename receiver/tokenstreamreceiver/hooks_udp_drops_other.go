// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import "net"

// dropsOOBBytes is 0: only Linux offers a socket's drop count (SO_RXQ_OVFL).
const dropsOOBBytes = 0

func enableDropCount(*net.UDPConn) bool { return false }

func dropCount([]byte) (uint32, bool) { return 0, false }
