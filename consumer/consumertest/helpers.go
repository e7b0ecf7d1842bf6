package consumertest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// Helpers for tests that run a consumer.Consumer against a real database:
// making and migrating it, running it in the background, counting what its
// batches report, and reading the effects and parked rows it left.

// Logger returns a debug-level text logger on stderr when the TEST_LOG
// environment variable is set, and nil otherwise, so that the consumer
// keeps its default: warnings and errors on stderr.
func Logger() *slog.Logger {
	if os.Getenv("TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// NewConsumer makes a consumer with consumer.New and applies its migrations,
// failing tb if either fails.
func NewConsumer(tb testing.TB, db pg.DB, src consumer.Source, cfg consumer.Config) *consumer.Consumer {
	tb.Helper()
	c, err := consumer.New(db, src, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return c
}

// Running is a consumer's Run in a goroutine of its own.
type Running struct {
	cancel context.CancelFunc
	done   chan error
}

// Start runs c in the background until Stop.
func Start(c *consumer.Consumer) *Running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	return r
}

// Stop cancels Run and waits for it to return, failing tb if Run returned
// an error. It must be called once, from the test's goroutine.
func (r *Running) Stop(tb testing.TB) {
	tb.Helper()
	r.cancel()
	if err := <-r.done; err != nil {
		tb.Fatalf("Run: %v", err)
	}
}

// RunUntilIdle runs c until b is Idle, then stops it. It fails tb if Run
// returned an error, or if b was not idle within timeout (a guard against a
// hung test, not a performance assertion).
func RunUntilIdle(tb testing.TB, c *consumer.Consumer, b *Broker, timeout time.Duration) {
	tb.Helper()
	r := Start(c)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	werr := b.WaitIdle(ctx)
	r.Stop(tb)
	if werr != nil {
		tb.Fatal(werr)
	}
}

// Totals sums the BatchStats a Counter was given.
type Totals struct {
	// Batches is the number of batches reported.
	Batches int
	// Size and the outcome counts summed over all batches.
	Size, Applied, Duplicate, Mismatch, Parked, Retried, Gap int
	// Batches by result; each batch counts in the first that applies:
	// Fenced (BatchStats.Fenced), Failed (BatchStats.Err set), Isolated
	// (BatchStats.Isolated), else OK.
	Fenced, Failed, Isolated, OK int
}

func (t Totals) String() string {
	return fmt.Sprintf("%d batches (%d ok, %d isolated, %d fenced, %d failed) of %d messages: "+
		"applied %d, duplicate %d, mismatch %d, parked %d, retried %d, gap %d",
		t.Batches, t.OK, t.Isolated, t.Fenced, t.Failed, t.Size,
		t.Applied, t.Duplicate, t.Mismatch, t.Parked, t.Retried, t.Gap)
}

// Counter is a consumer.Hook that keeps every BatchStats it is given and
// their Totals. It is safe for concurrent use, and one Counter may serve
// several consumers. The zero value is ready to use.
type Counter struct {
	mu      sync.Mutex
	total   Totals
	batches []consumer.BatchStats
}

var _ consumer.Hook = (*Counter)(nil)

// BatchDone records s.
func (c *Counter) BatchDone(_ context.Context, s *consumer.BatchStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches = append(c.batches, *s)
	t := &c.total
	t.Batches++
	t.Size += s.Size
	t.Applied += s.Applied
	t.Duplicate += s.Duplicate
	t.Mismatch += s.Mismatch
	t.Parked += s.Parked
	t.Retried += s.Retried
	t.Gap += s.Gap
	switch {
	case s.Fenced:
		t.Fenced++
	case s.Err != nil:
		t.Failed++
	case s.Isolated:
		t.Isolated++
	default:
		t.OK++
	}
}

// Total returns the totals so far.
func (c *Counter) Total() Totals {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// Batches returns a copy of every BatchStats so far, in the order reported.
func (c *Counter) Batches() []consumer.BatchStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]consumer.BatchStats(nil), c.batches...)
}

// String describes the totals so far.
func (c *Counter) String() string { return c.Total().String() }

// ParkedRow is a row of the parked-messages table.
type ParkedRow = parked.Row

// Parked returns the rows of the parked-messages table schema.table in the
// order they were parked, failing tb if they cannot be read. schema
// defaults to "effectively" and table to "parked", as in consumer.Config.
func Parked(tb testing.TB, db pg.DB, schema, table string) []ParkedRow {
	tb.Helper()
	out, err := parked.NewStore(db, schema, table).List(context.Background(), parked.Filter{})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// EffectCounts returns, for each value of column in table, how many rows
// have it: with one effect row per applied message, keyed by its ID, that
// is how many times each message was applied.
func EffectCounts(tb testing.TB, db pg.DB, table, column string) map[string]int {
	tb.Helper()
	col := pgx.Identifier{column}.Sanitize()
	rows, err := db.Query(context.Background(),
		`SELECT `+col+`, count(*) FROM `+pgx.Identifier{table}.Sanitize()+` GROUP BY `+col)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		tb.Fatal(err)
	}
	return out
}
