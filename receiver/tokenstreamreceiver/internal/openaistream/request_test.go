// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package openaistream

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scanAll feeds body to a scanner in pieces of n bytes and returns what it
// forwarded, finish included.
func scanAll(t *testing.T, body string, n int, inject bool) (out string, s *requestScanner, added bool) {
	t.Helper()
	s = &requestScanner{}
	var buf bytes.Buffer
	b := []byte(body)
	for len(b) > 0 {
		k := min(n, len(b))
		buf.Write(s.scan(b[:k]))
		buf.Write(s.release)
		s.release = s.release[:0]
		b = b[k:]
	}
	added, err := s.finish(&buf, inject)
	require.NoError(t, err)
	return buf.String(), s, added
}

func TestRequestScanner(t *testing.T) {
	tests := []struct {
		name                  string
		body                  string
		model                 string
		stream, usage, inject bool
		want                  string // "" means the body unchanged
	}{
		{
			name:   "streaming chat without usage gets it",
			body:   `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"What is {\"x\"}: 1, [2]?"}],"stream":true,"max_tokens":32}`,
			model:  "meta-llama/Llama-3.1-8B-Instruct",
			stream: true, inject: true,
			want: `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"What is {\"x\"}: 1, [2]?"}],"stream":true,"max_tokens":32,"stream_options":{"include_usage":true}}`,
		},
		{
			name:  "usage already asked for",
			body:  `{ "stream" : true , "stream_options" : { "include_usage" : true }, "model" : "m" }` + "\n",
			model: "m", stream: true, usage: true,
		},
		{
			name:   "stream_options without include_usage: left alone",
			body:   `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":false}}`,
			model:  "m",
			stream: true,
		},
		{
			name:   "include_usage false",
			body:   `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`,
			model:  "m",
			stream: true,
		},
		{
			name:  "not streaming",
			body:  `{"model":"m","prompt":"The capital of France is","stream":false}`,
			model: "m",
		},
		{
			name:   "stream last, before the brace",
			body:   `{"prompt":"x","model":"m","stream":true}   `,
			model:  "m",
			stream: true, inject: true,
			want: `{"prompt":"x","model":"m","stream":true,"stream_options":{"include_usage":true}}   `,
		},
		// vLLM's request model coerces the value (LaxBool): a stream it
		// takes for true gets usage like a literal true.
		{
			name:   "stream as a string",
			body:   `{"model":"m","stream":"true"}`,
			model:  "m",
			stream: true, inject: true,
			want: `{"model":"m","stream":"true","stream_options":{"include_usage":true}}`,
		},
		{
			name:   "stream as an escaped string, then more members",
			body:   `{"stream" : "Tru\u0065" , "model":"m"}`,
			model:  "m",
			stream: true, inject: true,
			want: `{"stream" : "Tru\u0065" , "model":"m","stream_options":{"include_usage":true}}`,
		},
		{
			name:   "stream as 1",
			body:   `{"model":"m","stream":1}`,
			model:  "m",
			stream: true, inject: true,
			want: `{"model":"m","stream":1,"stream_options":{"include_usage":true}}`,
		},
		{name: "stream as the string false", body: `{"model":"m","stream":"false"}`, model: "m"},
		{name: "stream as the string 0", body: `{"stream":"0","model":"m"}`, model: "m"},
		{name: "stream null", body: `{"model":"m","stream":null}`, model: "m"},
		{name: "stream an array", body: `{"model":"m","stream":["true"]}`, model: "m"},
		{name: "stream an object", body: `{"model":"m","stream":{"x":1}}`, model: "m"},
		{name: "stream a long string", body: `{"model":"m","stream":"` + strings.Repeat(" ", 100) + `true"}`, model: "m"},
		{
			name: "nested model and stream keys do not count",
			body: `{"metadata":{"model":"x","stream":true},"model":"real"}`, model: "real",
		},
		// Hostile model names: decoded, valid UTF-8 and at most
		// maxModelBytes (260), cut on a rune boundary; the proxy cuts them
		// to tokenevent.MaxValueBytes.
		{
			name: "escaped model", body: `{"model":"llama\"\u00e9\/\ud83d\ude00\n"}`,
			model: "llama\"é/\U0001F600\n",
		},
		{name: "invalid UTF-8 model", body: "{\"model\":\"a\xff\xfeb\xc3\"}", model: "a\uFFFD\uFFFDb\uFFFD"},
		{name: "lone surrogate model", body: `{"model":"x\udc00y"}`, model: "x\uFFFDy"},
		{name: "long multibyte model", body: `{"model":"a` + strings.Repeat("é", 200) + `"}`, model: "a" + strings.Repeat("é", 129)},
		{name: "long escaped model", body: `{"model":"` + strings.Repeat(`\u00e9`, 200) + `"}`, model: strings.Repeat("é", 130)},
		{name: "not an object", body: `[1,2]`},
		{name: "garbage", body: `}}}{`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want == "" {
				want = tt.body
			}
			for _, n := range []int{1, 2, 3, 7, len(tt.body)} {
				out, s, added := scanAll(t, tt.body, n, true)
				model, stream, usage := s.requestInfo()
				assert.Equal(t, tt.model, model, "read %d at a time", n)
				assert.Equal(t, tt.stream, stream, "read %d at a time", n)
				assert.Equal(t, tt.usage, usage, "read %d at a time", n)
				assert.Equal(t, tt.inject, added)
				assert.Equal(t, want, out, "read %d at a time", n)
			}
			out, _, added := scanAll(t, tt.body, 5, false)
			assert.False(t, added)
			assert.Equal(t, tt.body, out, "without injection the body is forwarded as is")
		})
	}
}

func TestRequestScannerLargePromptHoldsNothing(t *testing.T) {
	prompt := strings.Repeat("lorem ipsum ", 1<<18) // 3 MiB
	body := `{"model":"m","stream":true,"prompt":"` + prompt + `"}`
	s := &requestScanner{}
	forwarded := 0
	b := []byte(body)
	for len(b) > 0 {
		k := min(32<<10, len(b))
		forwarded += len(s.scan(b[:k]))
		b = b[k:]
	}
	assert.Equal(t, len(body)-1, forwarded, "all but the closing brace goes on at once")
	assert.LessOrEqual(t, cap(s.model)+cap(s.key)+cap(s.held), 1024)
}

// What follows the object's closing brace is held only while it is a
// little whitespace: anything else, or more, and the body is forwarded as
// it is, nothing held (it was held whole, up to max_request_body_size).
func TestRequestScannerHoldsLittleAfterTheObject(t *testing.T) {
	for name, body := range map[string]string{
		"garbage after the object": `{"model":"m","stream":true}` + strings.Repeat("x", 1<<20),
		"a stray leading brace":    `}` + strings.Repeat(`{"stream":true}`, 1<<16),
		"much whitespace":          `{"model":"m","stream":true}` + strings.Repeat(" ", 1<<20),
	} {
		t.Run(name, func(t *testing.T) {
			for _, n := range []int{1, 7, 4096, len(body)} {
				out, s, added := scanAll(t, body, n, true)
				assert.False(t, added)
				assert.Equal(t, body, out, "read %d at a time", n)
				assert.LessOrEqual(t, cap(s.held), 2*maxHeldBytes+n, "read %d at a time", n)
			}
		})
	}
	out, _, added := scanAll(t, `{"model":"m","stream":true}`+"  \n", 1, true)
	assert.True(t, added, "a little whitespace after the object still takes the member")
	assert.Equal(t, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`+"  \n", out)
}

func FuzzRequestScanner(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":true}`), 3)
	f.Add([]byte(`{"a":"\"}","stream":true,"stream_options":{"include_usage":true}}`), 1)
	f.Fuzz(func(t *testing.T, body []byte, n int) {
		n = max(1, n%64+1)
		s := &requestScanner{}
		var buf bytes.Buffer
		b := body
		for len(b) > 0 {
			k := min(n, len(b))
			buf.Write(s.scan(b[:k]))
			buf.Write(s.release)
			s.release = s.release[:0]
			b = b[k:]
			if len(s.held) > maxHeldBytes+1 {
				t.Fatalf("holds %d bytes", len(s.held))
			}
		}
		added, err := s.finish(&buf, true)
		if err != nil {
			t.Fatal(err)
		}
		if !added && !bytes.Equal(buf.Bytes(), body) {
			t.Fatalf("body changed without an injection: %q → %q", body, buf.Bytes())
		}
		if added && buf.Len() <= len(body) {
			t.Fatalf("injection without growth")
		}
	})
}

// oneByteReader returns its input a byte per Read, the last byte with
// io.EOF, as a client trickling its body would.
type oneByteReader struct{ b []byte }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	p[0], r.b = r.b[0], r.b[1:]
	if len(r.b) == 0 {
		return 1, io.EOF
	}
	return 1, nil
}

func TestScannedBody(t *testing.T) {
	const in = `{"model":"m","stream":true,"messages":[]}` + "\n"
	const want = `{"model":"m","stream":true,"messages":[],"stream_options":{"include_usage":true}}` + "\n"
	for name, src := range map[string]io.Reader{
		"whole":     strings.NewReader(in),
		"trickled":  &oneByteReader{b: []byte(in)},
		"with EOF":  iotest.DataErrReader(strings.NewReader(in)),
		"half/half": iotest.HalfReader(strings.NewReader(in)),
	} {
		t.Run(name, func(t *testing.T) {
			b := NewScannedBody(src)
			got, err := io.ReadAll(b)
			require.NoError(t, err)
			assert.Equal(t, want, string(got))
			model, _, injected := b.Stop()
			assert.Equal(t, "m", model)
			assert.True(t, injected)
			_, err = b.Read(make([]byte, 8))
			assert.ErrorIs(t, err, ErrBodyStopped)
		})
	}

	t.Run("stopped before the end", func(t *testing.T) {
		pr, pw := io.Pipe()
		b := NewScannedBody(pr)
		go func() { _, _ = io.WriteString(pw, `{"model":"m","stream":true,`) }()
		buf := make([]byte, 64)
		n, err := b.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, `{"model":"m","stream":true,`, string(buf[:n]))
		readErr := make(chan error, 1)
		go func() { // the transport, still reading while the response has come
			_, rerr := b.Read(buf)
			readErr <- rerr
		}()
		model, _, injected := b.Stop()
		assert.Equal(t, "m", model)
		assert.False(t, injected, "nothing added to a body that did not end")
		go func() { _, _ = io.WriteString(pw, `"max_tokens":8}`) }()
		assert.ErrorIs(t, <-readErr, ErrBodyStopped)
		pr.Close() // ends the write if the read above never reached the pipe
	})

	t.Run("never sent", func(t *testing.T) { // the upstream was unreachable
		b := NewScannedBody(strings.NewReader(`{"messages":[{"role":"user","content":"` + strings.Repeat("x", 10000) + `"}],"model":"m","stream":true}`))
		model, _, injected := b.Stop()
		assert.Equal(t, "m", model, "found past the first read")
		assert.False(t, injected)
	})

	t.Run("client error", func(t *testing.T) {
		b := NewScannedBody(iotest.ErrReader(io.ErrUnexpectedEOF))
		_, err := b.Read(make([]byte, 8))
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
		_, _, injected := b.Stop()
		assert.False(t, injected)
	})
}

func TestScannedBodyReleasesWhatFollowsTheObject(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","stream":true} trailing`,
		`{"model":"m","stream":true}` + strings.Repeat(" ", 3*maxHeldBytes) + "x",
		`}{"model":"m","stream":true}`,
	} {
		for name, src := range map[string]io.Reader{
			"byte by byte": &oneByteReader{b: []byte(body)},
			"whole":        strings.NewReader(body),
		} {
			b := NewScannedBody(src)
			got, err := io.ReadAll(b)
			require.NoError(t, err)
			assert.Equal(t, body, string(got), name)
			_, _, injected := b.Stop()
			assert.False(t, injected, name)
		}
	}
}

// The prompt's size is the bytes of the strings under "messages" or
// "prompt", as written, whatever the reads: nothing else in the body
// counts (the model, another member's strings, the top-level keys).
func TestScannedBodyPromptBytes(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hello world"}],"stream":true,"user":"someone"}`, int64(len("role") + len("user") + len("content") + len("hello world"))},
		{"escapes as written", `{"messages":[{"content":"a\"b\n"}],"model":"m"}`, int64(len("content") + len(`a\"b\n`))},
		{"completions", `{"prompt":"Once upon a time","model":"m","stream":true}`, int64(len("Once upon a time"))},
		{"prompt of strings", `{"prompt":["ab","cd"],"stream":true}`, 4},
		{"token ids: no strings", `{"prompt":[1,2,3],"stream":true}`, 0},
		{"none", `{"model":"m","stream":true}`, 0},
		{"not one object", `{"prompt":"abc"} {"x":1}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, src := range []io.Reader{strings.NewReader(tc.body), &oneByteReader{b: []byte(tc.body)}} {
				b := NewScannedBody(src)
				_, err := io.ReadAll(b)
				require.NoError(t, err)
				b.Stop()
				assert.Equal(t, tc.want, b.PromptBytes())
			}
		})
	}

	t.Run("cut short", func(t *testing.T) {
		b := NewScannedBody(iotest.TimeoutReader(strings.NewReader(`{"prompt":"abc",`)))
		_, _ = io.ReadAll(b)
		b.Stop()
		assert.Zero(t, b.PromptBytes(), "a body that did not end has no size")
	})
}
