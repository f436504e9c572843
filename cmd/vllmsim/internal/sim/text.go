// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sim

import "math/rand/v2"

// vocabulary of the simulated model; one word is one token.
var vocabulary = []string{
	"the", "of", "and", "to", "in", "a", "is", "that", "for", "it",
	"as", "was", "with", "be", "by", "on", "not", "he", "this", "are",
	"or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
	"you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
	"been", "if", "more", "when", "will", "would", "who", "so", "no", "model",
	"token", "cache", "batch", "prefill", "decode", "engine", "latency", "stream", "memory", "request",
	"Paris", "France", "capital", "river", "city", "north", "light", "time", "data", "system",
}

// nextWord draws the next token's text: a word with a leading space (none
// for the first token), now and then a punctuation mark instead.
func nextWord(rng *rand.Rand, first bool) string {
	if !first && rng.IntN(12) == 0 {
		if rng.IntN(3) == 0 {
			return ","
		}
		return "."
	}
	w := vocabulary[rng.IntN(len(vocabulary))]
	if first {
		return w
	}
	return " " + w
}
