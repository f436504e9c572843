// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	reqcommon "github.com/llm-d/llm-d-router/pkg/common/request"
	"github.com/llm-d/llm-d-router/pkg/epp/metadata"
)

// envoy asks the EPP where each request goes over ext_proc, as Envoy's
// ext_proc filter does (request headers, then the body), and sends the
// request there, as its ORIGINAL_DST cluster does.
type envoy struct {
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
	http   *http.Client
}

func newEnvoy(eppAddr string) (*envoy, error) {
	conn, err := grpc.NewClient(eppAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &envoy{
		conn: conn, client: extprocv3.NewExternalProcessorClient(conn),
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
	}, nil
}

// decision is what the EPP answered for one request.
type decision struct {
	// Dest is the endpoint picked (x-gateway-destination-endpoint).
	Dest string `json:"dest,omitempty"`
	// Scores are the weighted scores of the endpoints the profile scored:
	// those its filter kept (--emit-endpoint-scores).
	Scores map[string]float64 `json:"scores,omitempty"`
	// Refused is the status of an immediate response instead of a pick.
	Refused int `json:"refused,omitempty"`
}

// decide runs the request phase of one ext_proc stream.
func (e *envoy) decide(ctx context.Context, id string, body []byte) (decision, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := e.client.Process(ctx)
	if err != nil {
		return decision{}, err
	}
	headers := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte(http.MethodPost)},
		{Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: ":authority", RawValue: []byte("eppcheck")},
		{Key: "content-type", RawValue: []byte("application/json")},
		{Key: reqcommon.RequestIDHeaderKey, RawValue: []byte(id)},
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: headers}},
	}}); err != nil {
		return decision{}, err
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true},
	}}); err != nil {
		return decision{}, err
	}
	var d decision
	for {
		resp, err := stream.Recv()
		if err != nil {
			return d, fmt.Errorf("ext_proc: %w", err)
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			d.Refused = int(ir.GetStatus().GetCode())
			return d, stream.CloseSend()
		}
		if h := resp.GetRequestHeaders(); h != nil {
			for _, set := range h.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if set.GetHeader().GetKey() == metadata.DestinationEndpointKey {
					d.Dest = string(set.GetHeader().GetRawValue())
				}
			}
			lb := resp.GetDynamicMetadata().GetFields()[metadata.DestinationEndpointNamespace].GetStructValue()
			if scores := lb.GetFields()[metadata.DestinationEndpointScoresKey].GetStructValue(); scores != nil {
				d.Scores = make(map[string]float64, len(scores.GetFields()))
				for addr, v := range scores.GetFields() {
					d.Scores[addr] = v.GetNumberValue()
				}
			}
		}
		if b := resp.GetRequestBody(); b != nil {
			if sb := b.GetResponse().GetBodyMutation().GetStreamedResponse(); sb == nil || sb.GetEndOfStream() {
				// The request phase is over: Envoy would now send the
				// request upstream. Ending the stream here runs the EPP's
				// completion hooks (its Process returns on io.EOF).
				return d, stream.CloseSend()
			}
		}
	}
}

// outcome is how a request sent to its endpoint ended.
type outcome struct {
	Status int     `json:"status,omitempty"`
	Tokens int     `json:"tokens,omitempty"`
	MaxGap float64 `json:"max_gap_ms,omitempty"`
	Err    string  `json:"err,omitempty"`
}

// send streams the request to dest and reads it to the end.
func (e *envoy) send(ctx context.Context, dest string, body []byte) outcome {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+dest+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		return outcome{Err: err.Error()}
	}
	defer resp.Body.Close()
	o := outcome{Status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		o.Err = strings.TrimSpace(string(msg))
		return o
	}
	last := time.Now()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") || line == "data: [DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal([]byte(line[len("data: "):]), &chunk) != nil {
			continue
		}
		if len(chunk.Error) > 0 {
			o.Err = string(chunk.Error)
		}
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			now := time.Now()
			if o.Tokens > 0 {
				o.MaxGap = max(o.MaxGap, float64(now.Sub(last).Microseconds())/1000)
			}
			last = now
			o.Tokens++
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) {
		o.Err = err.Error()
	}
	return o
}
