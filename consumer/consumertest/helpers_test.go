package consumertest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestCounterTotals(t *testing.T) {
	var c consumertest.Counter
	ctx := context.Background()
	for _, s := range []consumer.BatchStats{
		{BatchInfo: consumer.BatchInfo{Size: 3}, Applied: 2, Duplicate: 1},
		{BatchInfo: consumer.BatchInfo{Size: 2}, Mismatch: 1, Parked: 1, Isolated: true},
		{BatchInfo: consumer.BatchInfo{Size: 4}, Retried: 4, Gap: 2, Err: errors.New("commit"), Isolated: true},
		{BatchInfo: consumer.BatchInfo{Size: 1}, Fenced: true, Err: errors.New("fenced")},
	} {
		c.BatchDone(ctx, &s)
	}
	want := consumertest.Totals{
		Batches: 4, Size: 10, Applied: 2, Duplicate: 1, Mismatch: 1, Parked: 1, Retried: 4, Gap: 2,
		Fenced: 1, Failed: 1, Isolated: 1, OK: 1,
	}
	if got := c.Total(); got != want {
		t.Errorf("Total() = %+v, want %+v", got, want)
	}
	if b := c.Batches(); len(b) != 4 || b[2].Size != 4 || !b[3].Fenced {
		t.Errorf("Batches() = %+v", b)
	}
	if s := c.String(); !strings.Contains(s, "4 batches") || !strings.Contains(s, "applied 2") {
		t.Errorf("String() = %q", s)
	}
}

// TestHelpersOnARealConsumer runs a consumer with the helpers over a broker
// that duplicates deliveries, with one poison message, and checks what each
// helper reports against what is known to have happened.
func TestHelpersOnARealConsumer(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	b := consumertest.New(consumertest.Config{Lanes: 2, DuplicateRate: 0.5, Source: "mem"})
	const n = 50
	for i := range n {
		b.Publish(i, consumer.Message{ID: fmt.Sprintf("m-%d", i), Value: []byte(fmt.Sprint(i))})
	}
	s, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	counter := &consumertest.Counter{}
	c := consumertest.NewConsumer(t, pool, b, consumer.Config{
		Name: "helpers", Strategy: s, Logger: consumertest.Logger(), Hooks: []consumer.Hook{counter},
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.ID == "m-7" {
				return consumer.Permanent(errors.New("poison"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
			return err
		},
	})
	consumertest.RunUntilIdle(t, c, b, 30*time.Second)

	counts := consumertest.EffectCounts(t, pool, "effects", "msg_id")
	if len(counts) != n-1 || counts["m-7"] != 0 {
		t.Errorf("effects for %d messages (m-7: %d), want %d and none for m-7", len(counts), counts["m-7"], n-1)
	}
	for id, k := range counts {
		if k != 1 {
			t.Errorf("%s has %d effects", id, k)
		}
	}
	rows := consumertest.Parked(t, pool, "", "")
	if len(rows) != 1 {
		t.Fatalf("parked %v, want m-7", rows)
	}
	p := rows[0]
	if p.DedupeID == nil || *p.DedupeID != "m-7" || p.Reason != parked.ReasonPermanent || !strings.Contains(p.LastError, "poison") ||
		string(p.Payload) != "7" || p.Source != "mem" || p.Lane == "" || p.Ref == "" || p.Attempts != 1 || !p.HasMarker || p.ID == 0 {
		t.Errorf("parked %v", p)
	}
	tot := counter.Total()
	if tot.Applied != n-1 || tot.Parked != 1 || tot.Applied+tot.Duplicate+tot.Parked != b.Stats().Delivered || tot.Batches != len(counter.Batches()) {
		t.Errorf("totals %v; broker delivered %d", tot, b.Stats().Delivered)
	}

	// Start and Stop: a second consumer on the same tables finds nothing
	// to do and stops cleanly.
	r := consumertest.Start(consumertest.NewConsumer(t, pool, b, consumer.Config{Name: "helpers", Strategy: s, Handler: func(context.Context, pgx.Tx, *consumer.Message) error { return nil }}))
	r.Stop(t)
	if got := consumertest.Parked(t, pool, "effectively", "parked"); len(got) != 1 {
		t.Errorf("parked %v after a restart", got)
	}
}
