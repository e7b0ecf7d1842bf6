package sinktest

import (
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// testKeyOrderUnderFailures: hot keys whose messages are large enough that
// one pass of a key spans many produce requests (64 KiB each), two relays,
// and a broker that, for a while, refuses some produce requests (with an
// error no client retries, and twice in a row with one clients retry),
// answers others as timed out after appending them, and holds others past
// the client's request timeout before appending them. A foreign
// read-committed reader (franz-go) must find every message, and each key's
// first occurrences in the order they were committed.
func testKeyOrderUnderFailures(t *testing.T, newSink NewSink) {
	k := kafkatest.New(t)
	fake := k.Fake()
	if fake == nil {
		t.Skip("needs the in-process cluster to inject broker failures")
	}
	topic := kafkatest.Name("order")
	CreateTopic(t, k, topic, 2, nil)
	db, o := setup(t)

	const keys, perKey = 6, 150
	value := make([]byte, 2<<10)
	_, _ = rand.Read(value)
	want := map[string]bool{}
	var batch []outbox.Message
	for n := range perKey {
		for kk := range keys {
			key := fmt.Sprintf("hot-%d", kk)
			id := fmt.Sprintf("%s-%04d", key, n)
			want[id] = true
			batch = append(batch, outbox.Message{Sink: "k", Key: []byte(key), Value: value, ID: id})
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
	// first 400: n%8 == 2 with UNKNOWN_SERVER_ERROR (retried by no
	// client), 4 and 5 with NOT_LEADER_FOR_PARTITION (retried, so a
	// request's first two tries fail), 7 with REQUEST_TIMED_OUT (appended
	// all the same, then retried: a duplicate unless the producer is
	// idempotent).
	// Every 16th (from the 12th, up to the 200th) the broker holds for
	// longer than the client's request timeout before appending it: the
	// client gives up on a request that lands later all the same.
	toTopic := ProducesTo(fake, topic)
	var seq, cur, slept atomic.Int64
	fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if !toTopic(req) {
			cur.Store(0)
			return nil, nil, false
		}
		n := seq.Add(1)
		cur.Store(n)
		if n <= 200 && n%16 == 12 {
			slept.Add(1)
			fake.SleepControl(func() { time.Sleep(400 * time.Millisecond) })
			cur.Store(n)
		}
		return nil, nil, false
	})
	fail := func(err *kerr.Error, rem ...int64) kfake.Fault {
		return kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: err, Count: -1, // the topic's requests only, by cur
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
		sink := newSink(t, k, topic, Options{BatchBytes: 64 << 10, Hurried: true})
		startRelay(t, db, outbox.RelayConfig{Owner: fmt.Sprintf("relay-%d", i), Sinks: map[string]outbox.Sink{"k": sink}, BatchSize: 500})
	}
	waitRows(t, db, 3*time.Minute, len(want), `SELECT count(*) FROM effectively.outbox WHERE published_at IS NOT NULL`)
	if faults.Hits() == 0 {
		t.Fatal("no produce request was failed")
	}
	t.Logf("%d produce requests, %d failed, %d held past the client's timeout", seq.Load(), faults.Hits(), slept.Load())

	recs := ReadForeign(t, k, topic, want, time.Minute)
	next := map[string]int{}
	seen := map[string]bool{}
	dupes := 0
	for _, r := range recs {
		if seen[r.ID] {
			dupes++
			continue
		}
		seen[r.ID] = true
		if due := fmt.Sprintf("%s-%04d", r.Key, next[r.Key]); r.ID != due {
			t.Fatalf("key %s: %s is the first occurrence read where %s was due (partition %d, offset %d)", r.Key, r.ID, due, r.Partition, r.Offset)
		}
		next[r.Key]++
	}
	t.Logf("%d records read, %d duplicates", len(recs), dupes)
}
