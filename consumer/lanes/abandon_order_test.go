package lanes

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
)

// abandonSource is a source on a Lanes whose first abandoned batch is
// settled while another worker's Fetch waits for the Lanes lock, the
// interleaving that a loaded machine produces now and then.
type abandonSource struct {
	t     *testing.T
	lanes *Lanes
	once  sync.Once
}

func (s *abandonSource) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	return s.lanes.Next(ctx, max)
}

func (s *abandonSource) Settle(_ context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	abandoned := len(ack) == 0 && len(retry) == 0
	forced := false
	if abandoned {
		s.once.Do(func() { forced = true })
	}
	if !forced {
		s.lanes.Settle(b, ack, retry)
		return nil
	}
	s.lanes.mu.Lock()
	defer s.lanes.mu.Unlock()
	// Wake the other worker, idle in Next: it loops and waits for the lock.
	s.lanes.broadcast()
	if err := waitForLockWaiter("(*Lanes).Next"); err != nil {
		s.t.Error(err)
	}
	if !s.lanes.settleLocked(b, ack, retry) {
		s.t.Error("the abandoned batch was not its lane's batch in flight")
	}
	return nil
}

// A sender's message whose batch is abandoned (its connection was lost) is
// applied before the sender's next one, even when another worker is about
// to fetch the lane as the batch is handed back: with a monotonic mark,
// the next one applied first makes the abandoned one a duplicate, and it
// is lost.
func TestAbandonedMessageAppliesBeforeItsSendersNext(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (seq bigint NOT NULL, n bigint GENERATED ALWAYS AS IDENTITY)`); err != nil {
		t.Fatal(err)
	}
	strat, err := highwater.New(highwater.Config{Mode: highwater.Monotonic})
	if err != nil {
		t.Fatal(err)
	}
	lanes := New(Config{})
	lanes.Open("p", nil)
	for seq := 1; seq <= 2; seq++ {
		lanes.Add("p", &consumer.Message{Lane: "p", Ref: strconv.Itoa(seq), Attempt: 1, Headers: []consumer.Header{
			{Key: "sender", Value: []byte("s")}, {Key: "seq", Value: []byte(strconv.Itoa(seq))},
		}})
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.DedupeKey.Seq == 1 && m.Attempt == 1 {
			// The connection is lost mid-batch: the batch is abandoned.
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (seq) VALUES ($1)`, m.DedupeKey.Seq)
		return err
	}
	c, err := consumer.New(pool, &abandonSource{t: t, lanes: lanes}, consumer.Config{
		Name:     "abandon",
		Strategy: strat,
		KeyFunc: func(m *consumer.Message) (dedupe.Key, error) {
			return highwater.HeaderKey(m.Header, "sender", "seq")
		},
		Handler:      handler,
		BatchSize:    1,
		Concurrency:  2,
		RetryBackoff: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	wait, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	for {
		changed := lanes.Changed()
		if lanes.Idle() {
			break
		}
		select {
		case <-changed:
		case <-wait.Done():
			cancel()
			<-done
			t.Fatal("the lane did not settle within a minute")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	rows, err := pool.Query(ctx, `SELECT seq FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(applied) != "[1 2]" {
		t.Fatalf("effects in commit order: %v, want [1 2]: the abandoned seq 1 was overtaken by seq 2", applied)
	}
}
