package sinktest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// testTopicCreatedLater: a sink whose client read the cluster's metadata
// while its topic did not exist (and keeps metadata for an hour) refuses a
// message for good, naming the unknown topic; once the topic is created,
// every message the relay publishes through that same sink reaches it,
// none parked, each key in commit order. A cached "unknown topic" is not
// the broker's answer.
func testTopicCreatedLater(t *testing.T, newSink NewSink) {
	k := kafkatest.New(t)
	topic := kafkatest.Name("later")
	sink := newSink(t, k, topic, Options{LongMetadataAge: true})

	err := firstError(sink.Publish(context.Background(), []outbox.Message{{Key: []byte("a"), Value: []byte("early"), ID: "early"}}))
	if !outbox.IsPermanent(err) || !refusedFor(err.Error(), "unknown topic") {
		t.Fatalf("Publish to a topic that does not exist: %v; want it refused for good as an unknown topic", err)
	}

	CreateTopic(t, k, topic, 2, nil)
	db, o := setup(t)
	want := emitKeys(t, db, o, 4, 25)
	startRelay(t, db, outbox.RelayConfig{Sinks: map[string]outbox.Sink{"k": sink}})
	checkAllPublished(t, k, db, topic, want)
}

// testUnknownTopicFromBroker: a broker that answers the first four produce
// requests for a topic that exists with UNKNOWN_TOPIC_OR_PARTITION (as a
// broker whose metadata lags the controller's does) costs no message: none
// is parked, every one reaches the topic, each key in commit order. (Four:
// franz-go gives up on a partition after more than four such answers in a
// row, kgo.UnknownTopicRetries, refreshing its metadata between them.)
func testUnknownTopicFromBroker(t *testing.T, newSink NewSink) {
	k := kafkatest.New(t)
	fake := k.Fake()
	if fake == nil {
		t.Skip("needs the in-process cluster to inject broker errors")
	}
	topic := kafkatest.Name("lagging")
	CreateTopic(t, k, topic, 2, nil)
	faults := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.UnknownTopicOrPartition, Count: 4,
		When: ProducesTo(fake, topic)})
	defer faults.Remove()

	db, o := setup(t)
	want := emitKeys(t, db, o, 4, 25)
	startRelay(t, db, outbox.RelayConfig{Sinks: map[string]outbox.Sink{"k": newSink(t, k, topic, Options{})}})
	checkAllPublished(t, k, db, topic, want)
	if faults.Hits() == 0 {
		t.Fatal("no produce request was answered UNKNOWN_TOPIC_OR_PARTITION")
	}
}

// firstError is the error Publish reported for its first message.
func firstError(err error) error {
	var pe outbox.PublishErrors
	if errors.As(err, &pe) {
		return pe[0]
	}
	return err
}

// emitKeys emits, for sink "k", perKey messages of each of keys keys,
// interleaved, in transactions of 20, and returns their IDs.
func emitKeys(t *testing.T, db *pgxpool.Pool, o *outbox.Outbox, keys, perKey int) map[string]bool {
	t.Helper()
	want := map[string]bool{}
	var batch []outbox.Message
	for n := range perKey {
		for kk := range keys {
			key := fmt.Sprintf("key-%d", kk)
			id := fmt.Sprintf("%s-%04d", key, n)
			want[id] = true
			batch = append(batch, outbox.Message{Sink: "k", Key: []byte(key), Value: []byte(id), ID: id})
			if len(batch) == 20 {
				emit(t, db, o, batch...)
				batch = nil
			}
		}
	}
	if len(batch) > 0 {
		emit(t, db, o, batch...)
	}
	return want
}

// checkAllPublished waits until every row is published or one is parked,
// fails t if any is parked, and reads the topic with a foreign reader: every ID in
// want must be there, each key's first occurrences in emit order (as
// emitKeys numbers them).
func checkAllPublished(t *testing.T, k *kafkatest.Cluster, db *pgxpool.Pool, topic string, want map[string]bool) {
	t.Helper()
	// -1 once a row is parked (no need to wait for the rest), else how many are published.
	waitCount(t, db, 2*time.Minute, func(n int) bool { return n == len(want) || n < 0 }, "", len(want),
		`SELECT CASE WHEN bool_or(parked_at IS NOT NULL) THEN -1 ELSE count(*) FILTER (WHERE published_at IS NOT NULL)::int END FROM effectively.outbox`)
	var parked int
	var reason string
	if err := db.QueryRow(context.Background(), `SELECT count(*), coalesce(min(park_reason), '') FROM effectively.outbox WHERE parked_at IS NOT NULL`).Scan(&parked, &reason); err != nil {
		t.Fatal(err)
	}
	if parked > 0 {
		t.Fatalf("%d messages for a topic that exists were parked, e.g. with %q", parked, reason)
	}
	next := map[string]int{}
	seen := map[string]bool{}
	for _, r := range ReadForeign(t, k, topic, want, time.Minute) {
		if seen[r.ID] {
			continue
		}
		seen[r.ID] = true
		if due := fmt.Sprintf("%s-%04d", r.Key, next[r.Key]); r.ID != due {
			t.Fatalf("key %s: %s is the first occurrence read where %s was due (partition %d, offset %d)", r.Key, r.ID, due, r.Partition, r.Offset)
		}
		next[r.Key]++
	}
}
