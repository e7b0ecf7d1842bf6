package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/jackc/pgx/v5"
)

// pipelineEnv is one partition with 20 records and a Source with
// Config.Pipeline that a consumer pipelines (Pipeline called).
func pipelineEnv(t *testing.T) (*env, *Source, context.Context) {
	e := newEnv(t, 1)
	e.produce(0, 20)
	s := e.source(func(c *Config) { c.Pipeline = true })
	s.Pipeline()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return e, s, ctx
}

// fetchN fetches a batch of up to n records.
func fetchN(t *testing.T, ctx context.Context, s *Source, n int) *consumer.Batch {
	t.Helper()
	b, err := s.Fetch(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeEffects begins a batch transaction with b's effects in it and runs
// BeforeCommit, acknowledging every message.
func writeEffects(t *testing.T, ctx context.Context, e *env, s *Source, b *consumer.Batch) (pgx.Tx, error) {
	t.Helper()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	for _, m := range b.Messages {
		_, _, off, _ := Position(m)
		if _, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, off) VALUES ($1, $2, $3)`, m.ID, b.Lane, off); err != nil {
			t.Fatal(err)
		}
	}
	return tx, s.BeforeCommit(ctx, tx, b, b.Messages)
}

func offsets(b *consumer.Batch) []int64 {
	out := make([]int64, len(b.Messages))
	for i, m := range b.Messages {
		_, _, out[i], _ = Position(m)
	}
	return out
}

// cancelled is a context that is already done.
func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestPipelineNextBatchWaitsForCommit: once a batch's offset is written
// in its transaction, the partition's next batch is handed out (the
// records after it, in order), but its handlers may not start
// (AwaitPrevious) and its offset cannot be written (BeforeCommit) until
// the first was committed and settled; then it goes on and commits after
// it.
func TestPipelineNextBatchWaitsForCommit(t *testing.T) {
	e, s, ctx := pipelineEnv(t)
	b1 := fetchN(t, ctx, s, 5)
	tx1, err := writeEffects(t, ctx, e, s, b1)
	if err != nil {
		t.Fatal(err)
	}
	b2 := fetchN(t, ctx, s, 5) // handed out while b1 commits
	if got, want := offsets(b2)[0], offsets(b1)[len(b1.Messages)-1]+1; got != want {
		t.Fatalf("the next batch starts at offset %d, want %d (right after the batch committing)", got, want)
	}
	if err := s.AwaitPrevious(cancelled(), b2); err == nil {
		t.Fatal("AwaitPrevious let the next batch's handlers run before the batch before it was settled")
	}
	tx2, err := writeEffects(t, ctx, e, s, b2)
	if err == nil {
		t.Fatal("BeforeCommit stored the next batch's offset before the batch before it was settled")
	}
	_ = tx2.Rollback(ctx)
	if got := e.storedOffsets()[0][0]; got > offsets(b1)[0] {
		t.Fatalf("stored offset %d before the first batch committed", got)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, b1, b1.Messages, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.AwaitPrevious(ctx, b2); err != nil {
		t.Fatalf("AwaitPrevious after the batch before committed whole: %v", err)
	}
	tx2, err = writeEffects(t, ctx, e, s, b2)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, b2, b2.Messages, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := e.storedOffsets()[0][0], offsets(b2)[len(b2.Messages)-1]+1; got != want {
		t.Fatalf("stored offset %d, want %d", got, want)
	}
}

// TestPipelineFailedCommitRedeliversInOrder: when the batch committing
// fails (rolled back, handed back), the batch handed out after it is
// refused at AwaitPrevious and handed back too, and the partition's
// records come again from the first one that did not commit, in offset
// order; nothing of either batch was stored.
func TestPipelineFailedCommitRedeliversInOrder(t *testing.T) {
	e, s, ctx := pipelineEnv(t)
	b1 := fetchN(t, ctx, s, 5)
	tx1, err := writeEffects(t, ctx, e, s, b1)
	if err != nil {
		t.Fatal(err)
	}
	b2 := fetchN(t, ctx, s, 5)
	_ = tx1.Rollback(ctx) // the COMMIT failed
	if err := s.Settle(ctx, b1, nil, nil); err != nil {
		t.Fatal(err)
	}
	err = s.AwaitPrevious(ctx, b2)
	if err == nil || errors.Is(err, consumer.ErrFenced) {
		t.Fatalf("AwaitPrevious after the batch before failed: %v, want an error that is not ErrFenced", err)
	}
	if err := s.Settle(ctx, b2, nil, nil); err != nil {
		t.Fatal(err)
	}
	want := offsets(b1)[0]
	for want < offsets(b2)[len(b2.Messages)-1] {
		b := fetchN(t, ctx, s, 20)
		if err := s.AwaitPrevious(ctx, b); err != nil {
			t.Fatal(err)
		}
		for i, off := range offsets(b) {
			if off != want {
				t.Fatalf("redelivered offset %d, want %d (offset order from the first record not committed)", off, want)
			}
			if off <= offsets(b2)[len(b2.Messages)-1] && b.Messages[i].Attempt != 2 {
				t.Fatalf("offset %d redelivered as attempt %d, want 2", off, b.Messages[i].Attempt)
			}
			want++
		}
		if err := process(ctx, s, e.pool, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	if rows, distinct := e.effects(); rows != distinct {
		t.Fatalf("%d effect rows for %d distinct messages", rows, distinct)
	}
}

// TestPipelineRecall: a batch whose commit failed runs another pass
// (Recall): the batch handed out after it is refused at once (its claims
// could hold what the new pass claims), the partition hands nothing out
// until the first is released again, and what comes next waits for the
// new pass's commit.
func TestPipelineRecall(t *testing.T) {
	e, s, ctx := pipelineEnv(t)
	b1 := fetchN(t, ctx, s, 5)
	tx1, err := writeEffects(t, ctx, e, s, b1)
	if err != nil {
		t.Fatal(err)
	}
	b2 := fetchN(t, ctx, s, 5)
	_ = tx1.Rollback(ctx) // the COMMIT was refused: another pass
	s.Recall(b1)
	if err := s.AwaitPrevious(ctx, b2); err == nil {
		t.Fatal("AwaitPrevious let a batch go on after the batch before it ran again")
	}
	if err := s.Settle(ctx, b2, nil, nil); err != nil {
		t.Fatal(err)
	}
	if st := s.sched.Lane(b1.Lane); st.Committing != b1 || st.InFlight != nil || !st.Held {
		t.Fatalf("lane state %+v after the batch after a recalled one settled: want the recalled batch committing and held, nothing else in flight", st)
	}
	tx1, err = writeEffects(t, ctx, e, s, b1) // the second pass
	if err != nil {
		t.Fatal(err)
	}
	b3 := fetchN(t, ctx, s, 20)
	if got := offsets(b3)[0]; got != offsets(b2)[0] {
		t.Fatalf("the batch after the second pass starts at %d, want %d", got, offsets(b2)[0])
	}
	if err := s.AwaitPrevious(cancelled(), b3); err == nil {
		t.Fatal("AwaitPrevious did not wait for the second pass")
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, b1, b1.Messages, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.AwaitPrevious(ctx, b3); err != nil {
		t.Fatal(err)
	}
}

// TestEnginePipelinedOrderAndOnce: a consumer with goroutines to spare
// over a pipelined source, with producer retries among the records:
// every message applied once, and each partition's effects committed in
// offset order.
func TestEnginePipelinedOrderAndOnce(t *testing.T) {
	const n = 3000
	e := newEnv(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.pool.Exec(ctx, `ALTER TABLE effects ADD COLUMN n bigserial`); err != nil {
		t.Fatal(err)
	}
	e.produce(0, n)
	e.produce(n-500, n) // producer retries: duplicates
	h := &consumertest.Counter{}
	src := e.source(func(c *Config) { c.Pipeline = true })
	c := e.engine(src, h, func(cfg *consumer.Config) {
		cfg.Concurrency = 4
		cfg.BatchSize = 50
	})
	r := consumertest.Start(c)
	e.waitEffects(n, time.Minute)
	r.Stop(t)
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d; %s", rows, distinct, n, h)
	}
	var outOfOrder int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM (
  SELECT off < lag(off) OVER (PARTITION BY lane ORDER BY n) AS back FROM effects) AS x WHERE back`).Scan(&outOfOrder); err != nil {
		t.Fatal(err)
	}
	if outOfOrder > 0 {
		t.Fatalf("%d effects committed before an effect of a lower offset of their partition", outOfOrder)
	}
	if src.releases.Load() == 0 {
		t.Error("no batch was released while it committed: the test did not pipeline")
	}
}
