package kafka

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
)

// A wrong broker address does not leave the consumer waiting in silence:
// Fetch reports the group's failure, the consumer logs it, and Run returns
// it once SourceFailureTimeout has passed.
func TestUnreachableBrokersStopRun(t *testing.T) {
	t.Parallel()
	// A port that nothing listens on: bind one, then close it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	pool := pgtest.NewPool(t)
	src, err := New(pool, Config{Brokers: []string{addr}, Group: "nowhere", Topics: []string{"t"},
		DialTimeout: time.Second, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := consumertest.NewConsumer(t, pool, src, consumer.Config{
		Name: "nowhere", Strategy: strategy, Logger: testLogger(),
		Handler:              func(context.Context, pgx.Tx, *consumer.Message) error { return nil },
		RetryBackoff:         100 * time.Millisecond,
		SourceFailureTimeout: 2 * time.Second,
	})
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("Run = %v, want the group's connection error", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Run did not return for brokers that cannot be reached")
	}
}
