// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package sharedcomponent

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
)

type counting struct {
	starts, stops int
	startErr      error
}

func (c *counting) Start(context.Context, component.Host) error { c.starts++; return c.startErr }
func (c *counting) Shutdown(context.Context) error              { c.stops++; return nil }

func TestSharedStartsAndStopsOnce(t *testing.T) {
	m := NewMap[component.ID, *counting]()
	id := component.MustNewID("token_session")
	created := 0
	create := func() (*counting, error) { created++; return &counting{}, nil }
	a, err := m.LoadOrStore(id, create)
	require.NoError(t, err)
	b, err := m.LoadOrStore(id, create)
	require.NoError(t, err)
	assert.Same(t, a, b)
	assert.Equal(t, 1, created)

	host := componenttest.NewNopHost()
	require.NoError(t, a.Start(context.Background(), host))
	require.NoError(t, b.Start(context.Background(), host))
	assert.Equal(t, 1, a.Unwrap().starts)
	require.NoError(t, a.Shutdown(context.Background()))
	require.NoError(t, b.Shutdown(context.Background()))
	assert.Equal(t, 1, a.Unwrap().stops)

	// After shutdown the key is free: a new component is created.
	c, err := m.LoadOrStore(id, create)
	require.NoError(t, err)
	assert.NotSame(t, a, c)
}

func TestStartErrorReturnedToEveryPipeline(t *testing.T) {
	m := NewMap[string, *counting]()
	boom := errors.New("boom")
	a, err := m.LoadOrStore("k", func() (*counting, error) { return &counting{startErr: boom}, nil })
	require.NoError(t, err)
	host := componenttest.NewNopHost()
	require.ErrorIs(t, a.Start(context.Background(), host), boom)
	require.ErrorIs(t, a.Start(context.Background(), host), boom)
	assert.Equal(t, 1, a.Unwrap().starts)
}

func TestCreateError(t *testing.T) {
	m := NewMap[string, *counting]()
	_, err := m.LoadOrStore("k", func() (*counting, error) { return nil, errors.New("bad config") })
	require.EqualError(t, err, "bad config")
}
