// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package httpserve // import "github.com/otelcol-llm/otelcol-llm/internal/httpserve"

import (
	"encoding/json"
	"net/http"
)

// Route picks the handler of a request's path; for a path it does not
// serve (or a bad one) it returns nil with the status and message to answer.
type Route func(r *http.Request) (serve http.HandlerFunc, code int, msg string)

// GetOnly serves what route picks to GET and HEAD requests; another method
// on a path route serves is answered 405 with Allow: GET, HEAD. The path is
// judged first: a path nothing serves is answered as route says whatever
// the method.
func GetOnly(route Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve, code, msg := route(r)
		if serve == nil {
			WriteError(w, code, msg)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			WriteError(w, http.StatusMethodNotAllowed, "method not allowed: GET only")
			return
		}
		serve(w, r)
	})
}

// WriteError answers code with {"error": msg} as JSON, neither cached nor
// sniffed as another type.
func WriteError(w http.ResponseWriter, code int, msg string) {
	body, _ := json.Marshal(map[string]string{"error": msg}) // a map of strings always encodes
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}
