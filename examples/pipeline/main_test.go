package main

import (
	"context"
	"testing"
)

// The pipeline checks its own balances; run a small one.
func TestPipeline(t *testing.T) {
	n := 4000
	if testing.Short() {
		n = 1500
	}
	if err := run(context.Background(), n, false); err != nil {
		t.Fatal(err)
	}
}
