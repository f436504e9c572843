// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func testRoute(r *http.Request) (http.HandlerFunc, int, string) {
	switch r.URL.Path {
	case "/here":
		return func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }, 0, ""
	case "/bad":
		return nil, http.StatusBadRequest, "bad path"
	}
	return nil, http.StatusNotFound, "no such endpoint: GET /here"
}

// GET and HEAD reach the handler; another method on a served path is 405
// with Allow; a path nothing serves is answered as the route says, whatever
// the method, each error as JSON.
func TestGetOnly(t *testing.T) {
	h := GetOnly(testRoute)
	do := func(method, path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader("x")))
		return w
	}
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		w := do(m, "/here")
		assert.Equal(t, http.StatusOK, w.Code, m)
		assert.Equal(t, "ok", w.Body.String(), m)
	}
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions} {
		w := do(m, "/here")
		assert.Equal(t, http.StatusMethodNotAllowed, w.Code, m)
		assert.Equal(t, "GET, HEAD", w.Header().Get("Allow"), m)
		assert.JSONEq(t, `{"error":"method not allowed: GET only"}`, w.Body.String(), m)
	}
	for path, want := range map[string]int{"/bad": http.StatusBadRequest, "/elsewhere": http.StatusNotFound} {
		w := do(http.MethodPost, path)
		assert.Equal(t, want, w.Code, path)
		assert.Empty(t, w.Header().Get("Allow"), path)
	}
	w := do(http.MethodGet, "/elsewhere")
	assert.JSONEq(t, `{"error":"no such endpoint: GET /here"}`, w.Body.String())
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	assert.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"))
	assert.True(t, strings.HasSuffix(w.Body.String(), "}\n"), "one JSON object, then a newline")
}
