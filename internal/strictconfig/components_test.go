package strictconfig_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"
	"github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"
)

// The check knows a section's keys from its fields, which holds for a type
// that decodes itself only where its Unmarshal decodes into its own fields
// (confighttp's settings) or is one the check knows (an Optional takes
// enabled too, a MapList a map of free keys). A type of the components'
// configurations that newly decodes itself, after an upgrade of the
// collector, fails this test until someone has read its Unmarshal and the
// check agrees with it.
func TestCustomUnmarshalersAreKnown(t *testing.T) {
	known := []string{
		"confighttp.ClientConfig", // conf.Unmarshal(cc) and the keepalive keys, all fields
		"confighttp.ServerConfig", // likewise
		"configopaque.MapList",    // a list of name/value, or a map with free keys
		"configoptional.Optional", // the held type's keys, and enabled
		"enginehealthexporter.Config",
		"tokensessionprocessor.Config",
		"tokenstreamreceiver.Config",
	}
	unmarshaler := reflect.TypeFor[confmap.Unmarshaler]()
	seen := map[reflect.Type]bool{}
	var found []string
	var visit func(reflect.Type)
	visit = func(t reflect.Type) {
		if seen[t] {
			return
		}
		seen[t] = true
		if reflect.PointerTo(t).Implements(unmarshaler) {
			name, _, _ := strings.Cut(t.String(), "[")
			if !slices.Contains(found, name) {
				found = append(found, name)
			}
		}
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
			visit(t.Elem())
		case reflect.Struct:
			for f := range t.Fields() {
				if f.IsExported() {
					visit(f.Type)
				}
			}
			if get, ok := reflect.PointerTo(t).MethodByName("Get"); ok && strings.HasPrefix(t.Name(), "Optional[") {
				visit(get.Type.Out(0).Elem())
			}
		}
	}
	visit(reflect.TypeFor[tokenstreamreceiver.Config]())
	visit(reflect.TypeFor[tokensessionprocessor.Config]())
	visit(reflect.TypeFor[enginehealthexporter.Config]())
	slices.Sort(found)
	assert.Equal(t, known, found)
}
