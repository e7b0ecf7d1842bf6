package effprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/metrics/effprom"
)

// BenchmarkBatchDone measures the hook's cost per batch: what it adds to
// the consumer's loop besides the database round trips.
func BenchmarkBatchDone(b *testing.B) {
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	st := &consumer.BatchStats{BatchInfo: consumer.BatchInfo{Consumer: "c", Strategy: "idset", Lane: "l", Batch: 1, Size: 100}, Applied: 90, Duplicate: 8, Parked: 1, Retried: 1,
		Claim: time.Millisecond, Handle: 3 * time.Millisecond, Commit: time.Millisecond, Ack: 100 * time.Microsecond, Total: 6 * time.Millisecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.BatchDone(ctx, st)
		}
	})
}

// BenchmarkMessageDone measures the cost per applied message.
func BenchmarkMessageDone(b *testing.B) {
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	e := consumer.MessageEvent{
		BatchInfo: consumer.BatchInfo{Consumer: "c", Strategy: "idset", Lane: "l", Batch: 1, Size: 100},
		Message:   &consumer.Message{Time: time.Now()},
		Outcome:   consumer.OutcomeApplied,
	}
	b.ReportAllocs()
	for b.Loop() {
		m.MessageDone(ctx, e)
	}
}
