// Package tokenhook is the client an inference engine embeds to send token
// events (session start, streamed token chunks, session end) to the
// otelcol-llm token_stream receiver, over UDP or HTTP, in the NDJSON wire
// schema of the collector's design.
//
// The calls an engine makes from its inference loop (Client.Start,
// Client.Token, Client.End) never block and never fail: they put the event
// on a bounded queue, or drop and count it when the queue is full. One
// background goroutine per Client encodes the queue into NDJSON batches and
// sends them; what happened to every event shows in Client.Stats. That
// goroutine polls the queue (every FlushInterval, or when a caller finds it
// half full) rather than waiting on it, so a call never pays for waking it.
//
//	hook, err := tokenhook.New(tokenhook.Config{Endpoint: "udp://127.0.0.1:4321"})
//	if err != nil {
//		return err
//	}
//	defer hook.Close(context.Background())
//
//	hook.Start(tokenhook.Start{SessionID: id, Time: received, Model: model, Operation: tokenhook.OperationChat})
//	for chunk := range stream {
//		hook.Token(id, time.Now(), chunk.Tokens)
//	}
//	hook.End(tokenhook.End{SessionID: id, Time: time.Now(), FinishReason: "stop"})
//
// Prompt and completion text has no field here on purpose: token events
// carry counts and times only.
package tokenhook // import "github.com/otelcol-llm/otelcol-llm/pkg/tokenhook"
