package tokenstreamreceiver

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The answer to a batch taken whole is written by hand on the hot path; it
// must be the answer writeResponse encodes, headers included.
func TestWriteAcceptedIsWriteResponse(t *testing.T) {
	for _, n := range []int{1, 42, 1000, 1 << 40} {
		fast, slow := httptest.NewRecorder(), httptest.NewRecorder()
		writeAccepted(fast, n)
		writeResponse(slow, http.StatusOK, &batchResponse{Accepted: n})
		assert.Equal(t, slow.Code, fast.Code)
		assert.Equal(t, slow.Body.String(), fast.Body.String())
		assert.Equal(t, slow.Header(), fast.Header())
	}
}

func TestNDJSONContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/x-ndjson":                true,
		"application/x-ndjson; charset=utf-8": true,
		"Application/JSON":                    true,
		"text/plain":                          false,
		"":                                    false,
		"application/x-ndjson; =":             false,
	} {
		assert.Equal(t, want, ndjsonContentType(ct), ct)
	}
}
