package tokenevent // import "github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"

// Limits bound what one line may hold. Zero values mean the defaults.
type Limits struct {
	// MaxLineBytes is the longest line accepted, newline excluded.
	MaxLineBytes int
	// MaxSessionIDBytes is the longest session_id accepted.
	MaxSessionIDBytes int
	// MaxAttributes is the most entries a start event's attributes may hold.
	MaxAttributes int
}

// Default limits.
const (
	DefaultMaxLineBytes      = 16 << 10
	DefaultMaxSessionIDBytes = 256
	DefaultMaxAttributes     = 32
	// DefaultMaxLinesPerBatch is how many lines of one request body or
	// datagram the token_stream receiver reads by default (ParseBatch's
	// maxLines); the hook clients keep their batches within it.
	DefaultMaxLinesPerBatch = 10_000
)

// WithDefaults is l with each zero limit set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = DefaultMaxLineBytes
	}
	if l.MaxSessionIDBytes <= 0 {
		l.MaxSessionIDBytes = DefaultMaxSessionIDBytes
	}
	if l.MaxAttributes <= 0 {
		l.MaxAttributes = DefaultMaxAttributes
	}
	return l
}

// FieldError says why a line was rejected. Field is the JSON key at fault,
// or empty when the line is not a JSON object at all.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}
