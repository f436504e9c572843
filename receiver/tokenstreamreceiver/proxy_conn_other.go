//go:build !linux

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import "net"

// proxyConn is c itself: the raw system call path is Linux only.
func proxyConn(c net.Conn) net.Conn { return c }
