package tokenhook_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenhook"
)

func Example() {
	// A stand-in for the collector's token_stream receiver; an engine would
	// use "http://127.0.0.1:4320/v1/token-events" or "udp://127.0.0.1:4321".
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer receiver.Close()

	hook, err := tokenhook.New(tokenhook.Config{
		Endpoint: receiver.URL + "/v1/token-events",
		Headers:  map[string]string{"Authorization": "Bearer example"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// In the engine: one Start per request, one Token per streamed chunk,
	// one End. None of these calls blocks.
	hook.Start(tokenhook.Start{
		SessionID:       "req-42",
		Time:            time.Now(),
		Model:           "meta-llama/Llama-3.1-8B-Instruct",
		Operation:       tokenhook.OperationChat,
		PromptTokens:    812,
		HasPromptTokens: true,
		Engine:          "vllm-0",
	})
	for range 3 {
		hook.Token("req-42", time.Now(), 1)
	}
	hook.End(tokenhook.End{SessionID: "req-42", Time: time.Now(), CompletionTokens: 3, HasCompletionTokens: true, FinishReason: "stop"})

	// At shutdown: send what is queued, waiting at most five seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hook.Close(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Printf("%+v\n", hook.Stats())
	// Output: {Sent:5 Dropped:0 Failed:0}
}
