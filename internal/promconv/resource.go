// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package promconv // import "github.com/otelcol-llm/otelcol-llm/internal/promconv"

import (
	"net"
	"net/url"
	"strconv"

	"go.opentelemetry.io/collector/pdata/pcommon"
)

// TargetResource sets the resource attributes of the target scraped at u:
// server.address, server.port (the scheme's default when the URL has none)
// and service.instance.id (host:port).
func TargetResource(u *url.URL) func(pcommon.Resource) {
	host, port := HostPort(u)
	portNum, _ := strconv.ParseInt(port, 10, 64)
	instance := net.JoinHostPort(host, port)
	return func(res pcommon.Resource) {
		attrs := res.Attributes()
		attrs.PutStr("server.address", host)
		attrs.PutInt("server.port", portNum)
		attrs.PutStr("service.instance.id", instance)
	}
}

// HostPort is the host and port of u, the port being the scheme's default
// (80, or 443 for https) when u has none. An engine's instance id is
// net.JoinHostPort of them, on the scraper's side as on the proxy's.
func HostPort(u *url.URL) (host, port string) {
	host, port = u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return host, port
}
