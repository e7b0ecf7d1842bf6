package kafka

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's Kafka cluster, topic, group and database.
type env struct {
	t          *testing.T
	kafka      *kafkatest.Cluster
	topic      string
	group      string
	partitions int
	pool       *pgxpool.Pool
}

func newEnv(t *testing.T, partitions int) *env {
	t.Helper()
	e := &env{
		t: t, kafka: kafkatest.New(t), topic: kafkatest.Name("orders"), group: kafkatest.Name("ledger"),
		partitions: partitions, pool: pgtest.NewPool(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.kafka.CreateTopic(ctx, e.topic, partitions); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return e
}

// config returns a Config with quick test settings.
func (e *env) config() Config {
	return Config{
		Brokers:           e.kafka.Brokers(),
		Group:             e.group,
		Topics:            []string{e.topic},
		MaxWait:           kafkatest.MaxWait,
		SessionTimeout:    kafkatest.SessionTimeout,
		HeartbeatInterval: kafkatest.HeartbeatInterval,
		RebalanceTimeout:  5 * time.Second,
		RevokeTimeout:     2 * time.Second,
		JoinGroupBackoff:  200 * time.Millisecond,
		Logger:            testLogger(),
	}
}

// testLogger logs to stderr when KAFKA_TEST_LOG is set (to "debug" for
// kafka-go's own logs too).
func testLogger() *slog.Logger {
	switch os.Getenv("KAFKA_TEST_LOG") {
	case "":
		return nil
	case "debug":
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

// source starts a migrated Source; it is closed at the end of the test.
func (e *env) source(mutate ...func(*Config)) *Source {
	e.t.Helper()
	cfg := e.config()
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := New(e.pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), e.pool, cfg.Schema, s.Migrations()...); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// produce writes messages from..to-1, message i to partition i%partitions
// with value "i" and idempotency-key "k-i".
func (e *env) produce(from, to int) {
	e.t.Helper()
	msgs := make([]kafkago.Message, 0, to-from)
	for i := from; i < to; i++ {
		v := strconv.Itoa(i)
		msgs = append(msgs, kafkago.Message{
			Partition: i % e.partitions,
			Value:     []byte(v),
			Headers:   []kafkago.Header{{Key: DefaultIDHeader, Value: []byte("k-" + v)}},
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.kafka.Produce(ctx, e.topic, msgs...); err != nil {
		e.t.Fatal(err)
	}
}

// process handles one batch the way the consumer engine does: effects and
// the offset in one transaction, then Settle. crash, when it returns true
// after the effects were written, makes process return errCrash with the
// transaction rolled back and the batch unsettled.
func process(ctx context.Context, s *Source, pool *pgxpool.Pool, b *consumer.Batch, crash func(*consumer.Batch) bool) error {
	return processWith(ctx, s, pool, b, crash, nil)
}

// processThen is process with committed called between the commit and
// Settle.
func processThen(ctx context.Context, s *Source, pool *pgxpool.Pool, b *consumer.Batch, committed func()) error {
	return processWith(ctx, s, pool, b, nil, committed)
}

func processWith(ctx context.Context, s *Source, pool *pgxpool.Pool, b *consumer.Batch, crash func(*consumer.Batch) bool, committed func()) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	ids := make([]string, len(b.Messages))
	offs := make([]int64, len(b.Messages))
	for i, m := range b.Messages {
		ids[i] = m.ID
		_, _, offs[i], _ = Position(m)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, off) SELECT u.id, $3, u.off FROM unnest($1::text[], $2::bigint[]) AS u(id, off)`, ids, offs, b.Lane); err != nil {
		return err
	}
	if crash != nil && crash(b) {
		return errCrash
	}
	if err := s.BeforeCommit(ctx, tx, b, b.Messages); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if committed != nil {
		committed()
	}
	return s.Settle(ctx, b, b.Messages, nil)
}

var errCrash = errors.New("simulated crash")

// workers runs n goroutines fetching and processing batches of s until ctx
// is done or one of them crashes. Fenced batches are counted in fenced.
type workers struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
	fenced  int
	batches int
}

func startWorkers(ctx context.Context, s *Source, pool *pgxpool.Pool, n, max int, crash func(*consumer.Batch) bool) *workers {
	w := &workers{}
	ctx, cancel := context.WithCancel(ctx)
	for range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for {
				b, err := s.Fetch(ctx, max)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, ErrClosed) {
						w.fail(err)
					}
					return
				}
				err = process(ctx, s, pool, b, crash)
				w.mu.Lock()
				w.batches++
				w.mu.Unlock()
				switch {
				case err == nil:
				case errors.Is(err, errCrash):
					cancel()
					return
				case errors.Is(err, consumer.ErrFenced):
					w.mu.Lock()
					w.fenced++
					w.mu.Unlock()
				case ctx.Err() != nil:
					return
				default:
					w.fail(err)
					return
				}
			}
		}()
	}
	go func() { w.wg.Wait(); cancel() }()
	return w
}

func (w *workers) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, err)
}

func (w *workers) wait(t *testing.T) {
	t.Helper()
	w.wg.Wait()
	for _, err := range w.errs {
		t.Error(err)
	}
}

// effects returns the number of effect rows and of distinct messages.
func (e *env) effects() (rows, distinct int) {
	e.t.Helper()
	err := e.pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT (lane, off)) FROM effects`).Scan(&rows, &distinct)
	if err != nil {
		e.t.Fatal(err)
	}
	return rows, distinct
}

// waitEffects waits until n distinct messages have an effect. It fails
// when no new effect appeared for stall (stretched by patience): it waits
// on progress, not on wall time, since a slow machine is not a stuck lane.
func (e *env) waitEffects(n int, stall time.Duration) {
	e.t.Helper()
	stall *= patience
	last, since := -1, time.Now()
	for {
		rows, d := e.effects()
		if d >= n {
			return
		}
		if d > last {
			last, since = d, time.Now()
		} else if time.Since(since) > stall {
			e.t.Fatalf("waiting for %d distinct effects: stuck at %d (%d rows) for %s", n, d, rows, stall)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// patience stretches the deadlines of these tests. A passing test returns
// as soon as its condition holds, so a long deadline costs it nothing,
// while a tight one fails on a slow or shared machine.
const patience = 4

// waitFor polls cond until it holds, failing after timeout (stretched by
// patience).
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	timeout *= patience
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// storedOffsets returns the offsets table's rows of the group, by partition.
func (e *env) storedOffsets() map[int][2]int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT partition, coalesce(next_offset, -1), generation FROM effectively.kafka_offsets WHERE group_id = $1 AND topic = $2`, e.group, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int][2]int64{}
	for rows.Next() {
		var p int
		var next, gen int64
		if err := rows.Scan(&p, &next, &gen); err != nil {
			e.t.Fatal(err)
		}
		out[p] = [2]int64{next, gen}
	}
	if rows.Err() != nil {
		e.t.Fatal(rows.Err())
	}
	return out
}

var _ = pgx.Identifier{}
