// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// A configured request header becomes a start attribute (the tenant for
// token_session's attribution) and still reaches the engine; a header not
// named stays out of telemetry, and a request without it has no attribute.
func TestProxyCopiesHeadersIntoStartAttributes(t *testing.T) {
	chat, _ := fixtureStreams(t)
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		replay(u, w, r, chat, func(int) time.Duration { return 0 })
	})
	sink := new(consumertest.LogsSink)
	tr := startTestProxy(t, up.URL, sink, func(c *Config) {
		c.HeaderAttributes = []HeaderAttribute{{Header: "X-Tenant-Id", Attribute: "tenant.id"}}
	})
	postChat(t, tr.proxyURL(), `{"model":"m","stream":true}`, map[string]string{"x-tenant-id": "acme", "X-User-Id": "u-1"})
	evs := sessionEvents(t, sink, 1)
	assert.Equal(t, []tokenevent.Attribute{{Key: "tenant.id", Value: "acme"}}, evs[0].Attributes)
	assert.Equal(t, "acme", up.headers[0].Get("X-Tenant-ID"), "forwarded")

	sink2 := new(consumertest.LogsSink)
	tr2 := startTestProxy(t, up.URL, sink2, func(c *Config) {
		c.HeaderAttributes = []HeaderAttribute{{Header: "X-Tenant-Id", Attribute: "tenant.id"}}
	})
	postChat(t, tr2.proxyURL(), `{"model":"m","stream":true}`, nil)
	assert.Empty(t, sessionEvents(t, sink2, 1)[0].Attributes)
}
