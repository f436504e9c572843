// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

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
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"
)

// Unmarshal decodes conf into cfg, a pointer to a struct, as conf.Unmarshal
// does (cfg keeps its defaults where conf says nothing), unless conf holds
// keys that cfg's type has no field for: then it fails with all of them,
// each by its path, in the collector's wording, which the collector's
// decoder completes with the section it decodes, the component's top level:
//
//	'' has invalid keys: hooks::http::bogus_http, proxy::stall::max_gpa
//
// A Config's own Unmarshal method calls it; conf is then the one confmap
// passes that method, which does not call the method again.
func Unmarshal(conf *confmap.Conf, cfg any) error {
	if unknown := unknownKeys(conf.ToStringMap(), reflect.TypeOf(cfg)); len(unknown) > 0 {
		return fmt.Errorf("has invalid keys: %s", strings.Join(unknown, ", "))
	}
	return conf.Unmarshal(cfg)
}

// unknownKeys walks raw, the configuration as maps and lists, beside t,
// the type it is decoded into, and returns the paths of the keys t has no
// place for, sorted.
func unknownKeys(raw map[string]any, t reflect.Type) []string {
	var unknown []string
	walk(raw, t, "", &unknown)
	slices.Sort(unknown)
	return unknown
}

var (
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	confUnmarshaler = reflect.TypeFor[confmap.Unmarshaler]()
)

// walk checks the value raw, decoded into a t at path, as confmap decodes
// it: a map into a struct, an Optional or a map, a list into a slice.
// Anything else decodes as a scalar, or fails to decode, which the decode
// reports.
func walk(raw any, t reflect.Type, path string, unknown *[]string) {
	t = deref(t)
	inner, optional := optionalOf(t)
	if optional {
		t = deref(inner)
	}
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		return // a scalar: component.ID, configcompression.Type
	}
	m, isMap := raw.(map[string]any)
	switch t.Kind() {
	case reflect.Struct:
		if isMap {
			checkSection(m, t, path, optional, unknown)
		}
	case reflect.Map:
		// The keys are the user's (header names, attributes); the values
		// are checked by their type.
		for k, v := range m {
			walk(v, t.Elem(), join(path, k), unknown)
		}
	case reflect.Slice, reflect.Array:
		if isMap && reflect.PointerTo(t).Implements(confUnmarshaler) {
			return // a list with a map form of its own: configopaque.MapList's name: value
		}
		list, _ := raw.([]any)
		for i, v := range list {
			walk(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i), unknown)
		}
	}
}

// checkSection records the keys of m that struct type t takes no field
// for, and walks the values of the others. A configoptional.Optional's
// section also takes enabled.
func checkSection(m map[string]any, t reflect.Type, path string, optional bool, unknown *[]string) {
	fields, remain := keysOf(t)
	for k, v := range m {
		ft, ok := fields[k]
		switch {
		case ok:
			walk(v, ft, join(path, k), unknown)
		case remain, optional && k == "enabled":
		default:
			*unknown = append(*unknown, join(path, k))
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
