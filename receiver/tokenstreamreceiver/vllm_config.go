// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"

	"github.com/otelcol-llm/otelcol-llm/internal/promconv"
)

const (
	defaultVLLMTarget       = "http://localhost:8000/metrics"
	defaultVLLMInterval     = 5 * time.Second
	defaultVLLMMaxBodyBytes = 16 << 20
)

// VLLMConfig is the vllm source: it scrapes the Prometheus /metrics endpoint
// of one or more engines and emits what it reads as metrics.
type VLLMConfig struct {
	// Targets are the /metrics URLs scraped, each on its own schedule.
	Targets []string `mapstructure:"targets"`
	// Interval is the time between two scrapes of a target.
	Interval time.Duration `mapstructure:"interval"`
	// Timeout bounds one scrape; 0 means the interval.
	Timeout time.Duration `mapstructure:"timeout"`
	// MaxBodyBytes is the largest exposition accepted; a larger one fails
	// the scrape.
	MaxBodyBytes int64 `mapstructure:"max_body_bytes"`
	// Client is the HTTP client (TLS, auth, headers, ...). Its endpoint is
	// not used: the URLs are the targets.
	Client confighttp.ClientConfig `mapstructure:"client"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func defaultVLLMConfig() VLLMConfig {
	return VLLMConfig{
		Targets:      []string{defaultVLLMTarget},
		Interval:     defaultVLLMInterval,
		MaxBodyBytes: defaultVLLMMaxBodyBytes,
		Client:       confighttp.NewDefaultClientConfig(),
	}
}

// scrapeTimeout is the timeout in effect: the interval unless set.
func (v *VLLMConfig) scrapeTimeout() time.Duration {
	if v.Timeout > 0 {
		return v.Timeout
	}
	return v.Interval
}

// validate returns every problem of the vllm block, each naming its key.
func (v *VLLMConfig) validate() []error {
	var errs []error
	if len(v.Targets) == 0 {
		errs = append(errs, fmt.Errorf("vllm::targets: at least one target is required"))
	}
	seen := make(map[string]int, len(v.Targets))
	for i, t := range v.Targets {
		// Errors show targets redacted: they end up in start-up logs.
		u, err := url.Parse(t)
		switch {
		case err != nil:
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // without the URL it quotes
			}
			errs = append(errs, fmt.Errorf("vllm::targets[%d]: %w", i, err))
			continue
		case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
			errs = append(errs, fmt.Errorf("vllm::targets[%d]: want an http(s) URL, got %q", i, redactURL(u)))
			continue
		}
		if j, ok := seen[t]; ok {
			errs = append(errs, fmt.Errorf("vllm::targets[%d]: duplicate of vllm::targets[%d] (%q)", i, j, redactURL(u)))
			continue
		}
		seen[t] = i
	}
	if v.Interval <= 0 {
		errs = append(errs, fmt.Errorf("vllm::interval: must be positive, got %s", v.Interval))
	}
	switch {
	case v.Timeout < 0:
		errs = append(errs, fmt.Errorf("vllm::timeout: must not be negative, got %s", v.Timeout))
	case v.Interval > 0 && v.Timeout > v.Interval:
		errs = append(errs, fmt.Errorf("vllm::timeout: %s exceeds vllm::interval (%s)", v.Timeout, v.Interval))
	}
	if v.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("vllm::max_body_bytes: must be positive, got %d", v.MaxBodyBytes))
	}
	if v.Client.Endpoint != "" {
		errs = append(errs, fmt.Errorf("vllm::client::endpoint: not used, list the /metrics URLs in vllm::targets (got %q)", v.Client.Endpoint))
	}
	return errs
}

// redactedValue replaces credentials in a target URL shown to people.
const redactedValue = "xxxxx"

// redactURL is u as logs, status and telemetry show it: userinfo (user and
// password alike: a user name alone is often a token) and every query value
// replaced by xxxxx, query keys kept, fragment dropped. Every query value is
// redacted, not only those with credential-like keys: a /metrics URL has no
// query that identifies its engine, and a list of key names would miss some
// token.
func redactURL(u *url.URL) string {
	r := *u
	if r.User != nil {
		r.User = url.User(redactedValue)
	}
	if r.RawQuery != "" {
		q := r.Query()
		for k, vs := range q {
			for i := range vs {
				vs[i] = redactedValue
			}
			q[k] = vs
		}
		r.RawQuery = q.Encode()
	}
	r.Fragment, r.RawFragment = "", ""
	return r.String()
}

// redactURLError replaces the URL an HTTP client error carries (the request
// URL with its user name and query; net/http masks only the password) by
// the redacted one. The result is for logs and status only: it keeps the
// message, not the chain.
func redactURLError(err error, redacted string) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.URL != "" && ue.URL != redacted {
		return errors.New(strings.ReplaceAll(err.Error(), ue.URL, redacted))
	}
	return err
}

// engineName names the engine served at u as the scraper names it (its
// resource's service.instance.id): host:port, with the scheme's default port
// when u has none. The proxy names its upstream the same way, so that
// token_session finds the engine state of a proxied session among several
// scraped targets.
func engineName(u *url.URL) string {
	return net.JoinHostPort(promconv.HostPort(u))
}
