package main

import (
	"context"
	"testing"
	"time"
)

// The demo checks its own ledger; run a small one.
func TestQuickstart(t *testing.T) {
	if err := run(context.Background(), 3000, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
}
