package cli_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A replay's dry run reads the topic as the consumer does: the records of
// aborted transactions and the transactions' control records are not
// counted as messages the replay would apply.
func TestReplayDryRunSkipsAbortedTransactions(t *testing.T) {
	t.Parallel()
	e := newKenv(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.k.Brokers()...), kgo.DefaultProduceTopic(e.topic),
		kgo.TransactionalID(e.topic+"-txn"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	committed := 0
	for txn := range 6 {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for j := range 5 {
			key := fmt.Sprintf("t%d-%d", txn, j)
			rec := &kgo.Record{Value: []byte("v-" + key), Headers: []kgo.RecordHeader{{Key: kafka.DefaultIDHeader, Value: []byte(key)}}}
			if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		end := kgo.TryAbort
		if txn%2 == 0 {
			end = kgo.TryCommit
			committed += 5
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	// 30 records and 6 markers; 15 records committed.
	if end := e.endOffsets()[0]; end != 36 {
		t.Fatalf("the partition ends at %d, want 36", end)
	}

	rep := e.dryRun("--to-offset", "0")
	if tt := rep.Total; tt.Messages != int64(committed) || tt.New != int64(committed) || tt.Applied != 0 {
		t.Fatalf("dry run before any consumer: %+v, want %d messages, all new", tt, committed)
	}
	f := &fixable{}
	if st := e.drain(f.handle); st.Applied != committed || st.Duplicate != 0 || st.Parked != 0 {
		t.Fatalf("the consumer: %+v, want %d applied", st, committed)
	}
	rep = e.dryRun("--to-offset", "0")
	if tt := rep.Total; tt.Messages != int64(committed) || tt.Applied != int64(committed) || tt.New != 0 || tt.ReplayDuplicate != int64(committed) {
		t.Fatalf("dry run after the consumer: %+v, want %d messages, all applied", tt, committed)
	}
}
