package main

import (
	"context"
	"testing"
)

// The example checks its own outcome; run a small one.
func TestPaymentsAPI(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 600
	}
	if err := run(context.Background(), n, false); err != nil {
		t.Fatal(err)
	}
}
