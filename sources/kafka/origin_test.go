package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	kafkago "github.com/segmentio/kafka-go"
)

func TestOriginMetadata(t *testing.T) {
	for _, origin := range []int64{0, 7, 1 << 40} {
		if got := parseOrigin(originMetadata(origin)); got != origin {
			t.Errorf("origin %d: parsed back as %d", origin, got)
		}
	}
	for _, meta := range []string{"", "x", originPrefix, originPrefix + "-3", originPrefix + "12a", "other/1 pg origin=5"} {
		if got := parseOrigin(meta); got != -1 {
			t.Errorf("metadata %q: origin %d, want -1 (not the source's)", meta, got)
		}
	}
	if meta := originMetadata(-1); meta != "" {
		t.Errorf("unknown origin: metadata %q, want none", meta)
	}
}

// commitForeign commits offset next of every partition for the group the
// way a consumer without this library does: a kafka-go group member's
// commit, with no metadata.
func (e *env) commitForeign(next int64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID: e.group, Brokers: e.kafka.Brokers(), Topics: []string{e.topic},
		SessionTimeout: kafkatest.SessionTimeout, HeartbeatInterval: kafkatest.HeartbeatInterval,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = g.Close() }()
	gen, err := g.Next(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	offs := map[int]int64{}
	for p := range e.partitions {
		offs[p] = next
	}
	if err := gen.CommitOffsets(map[string]map[int]int64{e.topic: offs}); err != nil {
		e.t.Fatal(err)
	}
}

// kafkaMetadata returns the metadata of the group's commits, by partition.
func (e *env) kafkaMetadata() map[int]string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := &kafkago.Client{Addr: kafkago.TCP(e.kafka.Brokers()...)}
	res, err := cl.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: e.group, Topics: map[string][]int{e.topic: {0, 1}}})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int]string{}
	for _, p := range res.Topics[e.topic] {
		out[p.Partition] = p.Metadata
	}
	return out
}

// TestLostOffsetsRowsStartAtTheOrigin: a group that committed offset 50
// of each partition to Kafka before it used this library starts there
// (an existing group migrating), and its commits to Kafka carry that
// origin from then on. When the database then loses everything the
// group stored (its offsets rows, and its effects with them), the source
// does not take Kafka's offsets, which are past what the database lost:
// it consumes each partition again from its origin, 50, and so every
// message from there on has exactly one effect, and none before it.
func TestLostOffsetsRowsStartAtTheOrigin(t *testing.T) {
	const perPartition, migrated = 200, 50
	const want = 2 * (perPartition - migrated)
	e := newEnv(t, 2)
	e.produce(0, 2*perPartition)
	e.commitForeign(migrated)

	check := func(round string) {
		t.Helper()
		rows, distinct := e.effects()
		var below int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE off < $1`, migrated).Scan(&below); err != nil {
			t.Fatal(err)
		}
		if rows != want || distinct != want || below != 0 {
			t.Fatalf("%s: %d effect rows for %d distinct messages, %d below offset %d; want %d of each and none below",
				round, rows, distinct, below, migrated, want)
		}
	}
	consume := func(round string) {
		t.Helper()
		s := e.source()
		ctx, cancel := context.WithCancel(context.Background())
		w := startWorkers(ctx, s, e.pool, 2, 40, nil)
		e.waitEffects(want, 30*time.Second)
		waitFor(t, 10*time.Second, "the Kafka commits of the last batches", func() bool {
			offs, err := e.kafka.CommittedOffsets(context.Background(), e.group, e.topic)
			if err != nil {
				t.Fatal(err)
			}
			return offs[0] == perPartition && offs[1] == perPartition
		})
		cancel()
		w.wait(t)
		_ = s.Close()
		check(round)
	}

	consume("migrated group")
	for p, meta := range e.kafkaMetadata() {
		if got := parseOrigin(meta); got != migrated {
			t.Errorf("partition %d: the commit to Kafka carries metadata %q, want origin %d", p, meta, migrated)
		}
	}

	// The database loses what the group stored, as a restore from a
	// backup taken before the group started, or a failover to a standby
	// that lagged that far, would.
	if _, err := e.pool.Exec(context.Background(), `DELETE FROM effects; DELETE FROM effectively.kafka_offsets`); err != nil {
		t.Fatal(err)
	}
	consume("after the database lost the group's commits")
}
