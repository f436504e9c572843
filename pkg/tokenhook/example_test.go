// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokenhook_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenhook"
)

// The README's "Hook clients" section shows this example from hook, err :=
// to the last Printf; TestReadmeShowsExample holds the two to each other.
func Example() {
	// A stand-in for the collector's token_stream receiver. An engine would
	// use "udp://127.0.0.1:4321" or "http://127.0.0.1:4320/v1/token-events".
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer receiver.Close()
	endpoint := receiver.URL + "/v1/token-events"

	hook, err := tokenhook.New(tokenhook.Config{Endpoint: endpoint})
	if err != nil {
		fmt.Println(err)
		return
	}

	// In the engine: one Start per request, one Token per streamed chunk,
	// one End. None of these calls blocks. Each returns an error only for
	// an invalid event, which is then not sent.
	id, received := "req-42", time.Now()
	err = hook.Start(tokenhook.Start{
		SessionID: id, Time: received, Model: "meta-llama/Llama-3.1-8B-Instruct",
		Operation: tokenhook.OperationChat, PromptTokens: 812, HasPromptTokens: true,
	})
	if err != nil {
		fmt.Println(err)
	}
	for range 3 { // as the chunks stream
		_ = hook.Token(id, time.Now(), 1)
	}
	_ = hook.End(tokenhook.End{SessionID: id, CompletionTokens: 3, HasCompletionTokens: true, FinishReason: "stop"})
	fmt.Println(hook.Token("", time.Now(), 1))

	// At shutdown: send what is queued, waiting at most five seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hook.Close(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Printf("%+v\n", hook.Stats())
	// Output:
	// session_id: must not be empty
	// {Sent:5 Dropped:0 Failed:0 Rejected:0}
}

// Send takes the collector's own event model, e.g. to forward events that
// were already parsed.
func ExampleClient_Send() {
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer receiver.Close()
	hook, err := tokenhook.New(tokenhook.Config{Endpoint: receiver.URL})
	if err != nil {
		fmt.Println(err)
		return
	}
	t := uint64(time.Now().UnixNano())
	fmt.Println(hook.Send(&tokenhook.Event{Kind: tokenhook.KindToken, SessionID: "req-43", TimeUnixNano: t, Count: 2}))
	fmt.Println(hook.Send(&tokenhook.Event{Kind: tokenhook.KindToken, SessionID: "req-43", TimeUnixNano: t}))
	_ = hook.Close(context.Background())
	fmt.Printf("%+v\n", hook.Stats())
	// Output:
	// <nil>
	// count: must be at least 1
	// {Sent:1 Dropped:0 Failed:0 Rejected:0}
}
