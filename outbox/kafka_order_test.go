package outbox

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestKafkaSinkKeyOrderUnderFailures: hot keys whose messages are large
// enough that one pass of a key spans many produce requests (the Writer's
// BatchBytes is 64 KiB), two relays, and a broker that, for a while,
// refuses some produce requests (with an error kafka-go does not retry, and
// twice in a row with one it does, past the Writer's two attempts),
// answers others as timed out after appending them, and holds others past
// the client's WriteTimeout before appending them. A foreign
// read-committed reader (franz-go) must find every message, and each key's
// first occurrences in the order they were committed.
func TestKafkaSinkKeyOrderUnderFailures(t *testing.T) {
	k := kafkatest.New(t)
	fake := k.Fake()
	if fake == nil {
		t.Skip("needs the in-process cluster to inject broker failures")
	}
	topic := kafkatest.Name("order")
	createTopic(t, k, topic, 2, nil)
	db, o := setup(t, Config{Mode: TableMode})

	const keys, perKey = 6, 150
	value := make([]byte, 2<<10)
	_, _ = rand.Read(value)
	want := map[string]bool{}
	var batch []Message
	for n := range perKey {
		for kk := range keys {
			key := fmt.Sprintf("hot-%d", kk)
			id := fmt.Sprintf("%s-%04d", key, n)
			want[id] = true
			batch = append(batch, Message{Sink: "k", Key: []byte(key), Value: value, ID: id})
		}
		if len(batch) >= 60 {
			emit(t, db, o, batch...)
			batch = nil
		}
	}
	if len(batch) > 0 {
		emit(t, db, o, batch...)
	}

	// Number the produce requests to the topic, then fail some of the
	// first 400: n%8 == 2 with UNKNOWN_SERVER_ERROR (not retried by
	// kafka-go), 4 and 5 with NOT_LEADER_FOR_PARTITION (retried, so both
	// attempts of a request fail), 7 with REQUEST_TIMED_OUT (appended all
	// the same, then retried: a duplicate).
	// Every 16th (from the 12th, up to the 200th) the broker holds for
	// longer than the Writer's WriteTimeout before appending it: the
	// client gives up on a request that lands later all the same.
	var seq, cur, slept atomic.Int64
	fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			if tp.Topic == topic {
				n := seq.Add(1)
				cur.Store(n)
				if n <= 200 && n%16 == 12 {
					slept.Add(1)
					fake.SleepControl(func() { time.Sleep(400 * time.Millisecond) })
					cur.Store(n)
				}
				return nil, nil, false
			}
		}
		cur.Store(0)
		return nil, nil, false
	})
	fail := func(err *kerr.Error, rem ...int64) kfake.Fault {
		return kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: err, Count: -1,
			When: func(kmsg.Request) bool {
				n := cur.Load()
				if n == 0 || n > 400 {
					return false
				}
				for _, r := range rem {
					if n%8 == r {
						return true
					}
				}
				return false
			}}
	}
	faults := fake.Fault(fail(kerr.UnknownServerError, 2), fail(kerr.NotLeaderForPartition, 4, 5), fail(kerr.RequestTimedOut, 7))
	defer faults.Remove()

	for i := range 2 {
		w := k.Writer(topic)
		w.Balancer = &kafkago.Hash{}
		w.BatchBytes = 64 << 10
		w.MaxAttempts = 2
		w.WriteBackoffMin, w.WriteBackoffMax = time.Millisecond, 5*time.Millisecond
		w.WriteTimeout = 200 * time.Millisecond
		t.Cleanup(func() { _ = w.Close() })
		sink, err := NewKafkaSink(w)
		if err != nil {
			t.Fatal(err)
		}
		startRelay(t, db, RelayConfig{Owner: fmt.Sprintf("relay-%d", i), Sinks: map[string]Sink{"k": sink}, BatchSize: 500})
	}
	waitRows(t, db, 3*time.Minute, len(want), `SELECT count(*) FROM effectively.outbox WHERE published_at IS NOT NULL`)
	if faults.Hits() == 0 {
		t.Fatal("no produce request was failed")
	}
	t.Logf("%d produce requests, %d failed, %d held past the client's timeout", seq.Load(), faults.Hits(), slept.Load())

	recs := readForeign(t, k, topic, want, time.Minute)
	next := map[string]int{}
	seen := map[string]bool{}
	dupes := 0
	for _, r := range recs {
		if seen[r.id] {
			dupes++
			continue
		}
		seen[r.id] = true
		if due := fmt.Sprintf("%s-%04d", r.key, next[r.key]); r.id != due {
			t.Fatalf("key %s: %s is the first occurrence read where %s was due (partition %d, offset %d)", r.key, r.id, due, r.partition, r.offset)
		}
		next[r.key]++
	}
	t.Logf("%d records read, %d duplicates", len(recs), dupes)
	_ = context.Background
}
