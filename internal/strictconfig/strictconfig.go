// Package strictconfig refuses the configuration keys a component does not
// know, in every section: the token_stream receiver, the token_session
// processor and the engine_health exporter decode their configuration
// through Unmarshal.
//
// The collector refuses unknown keys itself (mapstructure's ErrorUnused),
// except where a section embeds confighttp's server or client settings
// (open-telemetry/opentelemetry-collector#15907, since v0.160): their
// Unmarshal decodes with confmap.WithIgnoreUnused, because a squashed
// section's keys sit beside its parent's, and confmap decodes the parent's
// other fields with IgnoreUnused too, so neither decode reports a key that
// neither took, in that section or below it. Until the collector fixes
// that, Unmarshal checks the raw configuration against the keys the
// configuration's type declares; remove it once the collector refuses them
// again.
package strictconfig // import "github.com/otelcol-llm/otelcol-llm/internal/strictconfig"

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"
)

// Unmarshal decodes conf into cfg as conf.Unmarshal does (cfg keeps its
// defaults where conf says nothing), and fails with one error per section
// that holds keys cfg's type has no field for, each naming the section by
// its path: 'proxy::stall' has invalid keys: max_gpa. A Config's own
// Unmarshal method calls it; conf is then the one confmap passes that
// method, which does not call the method again.
func Unmarshal(conf *confmap.Conf, cfg any) error {
	unknown := unknownKeys(conf.ToStringMap(), reflect.TypeOf(cfg))
	return errors.Join(unknown, conf.Unmarshal(cfg))
}

// unknownKeys walks raw, the configuration as maps and lists, beside t,
// the type it is decoded into.
func unknownKeys(raw map[string]any, t reflect.Type) error {
	invalid := map[string][]string{} // section path -> its unknown keys
	walk(raw, t, "", invalid)
	paths := make([]string, 0, len(invalid))
	for p := range invalid {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	errs := make([]error, 0, len(paths))
	for _, p := range paths {
		keys := invalid[p]
		slices.Sort(keys)
		// The collector's own wording, with the path in its :: notation.
		errs = append(errs, fmt.Errorf("'%s' has invalid keys: %s", p, strings.Join(keys, ", ")))
	}
	return errors.Join(errs...)
}

var (
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	confUnmarshaler = reflect.TypeFor[confmap.Unmarshaler]()
)

// walk checks the value raw, decoded into a t at path, as confmap decodes
// it: a map into a struct, an Optional or a map, a list into a slice.
// Anything else decodes as a scalar, or fails to decode, which the decode
// reports.
func walk(raw any, t reflect.Type, path string, invalid map[string][]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		return // a scalar: component.ID, configcompression.Type
	}
	m, isMap := raw.(map[string]any)
	if inner, ok := optionalOf(t); ok {
		if inner = deref(inner); isMap && inner.Kind() == reflect.Struct && !reflect.PointerTo(inner).Implements(textUnmarshaler) {
			checkSection(m, inner, path, true, invalid)
		} else {
			walk(raw, inner, path, invalid)
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if isMap {
			checkSection(m, t, path, false, invalid)
		}
	case reflect.Map:
		// The keys are the user's (header names, attributes); the values
		// are checked by their type.
		for k, v := range m {
			walk(v, t.Elem(), join(path, k), invalid)
		}
	case reflect.Slice, reflect.Array:
		if isMap && reflect.PointerTo(t).Implements(confUnmarshaler) {
			return // a list with a map form of its own: configopaque.MapList's name: value
		}
		list, _ := raw.([]any)
		for i, v := range list {
			walk(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i), invalid)
		}
	}
}

// checkSection records the keys of m that struct type t takes no field
// for, and walks the values of the others. A configoptional.Optional's
// section also takes enabled.
func checkSection(m map[string]any, t reflect.Type, path string, optional bool, invalid map[string][]string) {
	fields, remain := keysOf(t)
	for k, v := range m {
		ft, ok := fields[k]
		switch {
		case ok:
			walk(v, ft, join(path, k), invalid)
		case remain, optional && k == "enabled":
		default:
			invalid[path] = append(invalid[path], k)
		}
	}
}

// keysOf returns the keys a struct type takes, by the mapstructure rules
// confmap decodes with: the tag's name, else the field's name; a squashed
// field's keys at its parent's level; a remain field takes every key.
func keysOf(t reflect.Type) (fields map[string]reflect.Type, remain bool) {
	fields = map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get(confmap.MapstructureTag), ",")
		if name == "-" {
			continue
		}
		options := strings.Split(opts, ",")
		if slices.Contains(options, "remain") {
			remain = true
			continue
		}
		if ft := deref(f.Type); slices.Contains(options, "squash") && ft.Kind() == reflect.Struct {
			sub, subRemain := keysOf(ft)
			for k, v := range sub {
				fields[k] = v
			}
			remain = remain || subRemain
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	return fields, remain
}

// optionalOf reports whether t is a configoptional.Optional, and the type it
// holds: its keys, and enabled, are the section's.
func optionalOf(t reflect.Type) (reflect.Type, bool) {
	if t.PkgPath() != optionalPkg || !strings.HasPrefix(t.Name(), "Optional[") {
		return nil, false
	}
	get, ok := reflect.PointerTo(t).MethodByName("Get") // func(*Optional[T]) *T
	if !ok {
		return nil, false
	}
	return get.Type.Out(0).Elem(), true
}

var optionalPkg = reflect.TypeFor[configoptional.Optional[struct{}]]().PkgPath()

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// join is a key's path in the collector's notation: proxy::stall::max_gap.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + confmap.KeyDelimiter + key
}
