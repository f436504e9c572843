// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package earlystop

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStopAll(t *testing.T) {
	var order []string
	var unregisterB func()
	unregisterA := Register(func(context.Context) error { order = append(order, "a"); return nil })
	unregisterB = Register(func(context.Context) error {
		order = append(order, "b")
		unregisterB() // as a receiver's own shutdown does
		return errors.New("b failed")
	})
	unregisterC := Register(func(context.Context) error { order = append(order, "c"); return nil })
	unregisterC()

	err := StopAll(context.Background())
	assert.EqualError(t, err, "b failed")
	assert.Equal(t, []string{"a", "b"}, order, "in registration order; c was removed")

	order = nil
	assert.NoError(t, StopAll(context.Background()))
	assert.Equal(t, []string{"a"}, order, "b removed itself")
	unregisterA()
	unregisterA() // twice is harmless
	assert.NoError(t, StopAll(context.Background()))
	assert.Equal(t, []string{"a"}, order)
}
