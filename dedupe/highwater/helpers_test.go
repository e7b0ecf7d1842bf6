package highwater_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// stmtCounter is a pgx tracer that counts the statements sent to the server
// (other than transaction control) and the round trips that carried them.
type stmtCounter struct {
	statements, roundTrips atomic.Int64
}

func isTxControl(sql string) bool {
	s := strings.ToLower(strings.TrimSpace(sql))
	return strings.HasPrefix(s, "begin") || strings.HasPrefix(s, "commit") || strings.HasPrefix(s, "rollback")
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !isTxControl(d.SQL) {
		c.statements.Add(1)
		c.roundTrips.Add(1)
	}
	return ctx
}
func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	return ctx
}
func (c *stmtCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}
func (c *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *stmtCounter) reset() { c.statements.Store(0); c.roundTrips.Store(0) }

// newPool returns a pool on a fresh database, traced by the returned counter.
func newPool(tb testing.TB) (*pgxpool.Pool, *stmtCounter) {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	counter := &stmtCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, counter
}

// newStrategy makes a strategy and applies its migrations.
func newStrategy(tb testing.TB, pool *pgxpool.Pool, cfg highwater.Config) *highwater.Strategy {
	tb.Helper()
	s, err := highwater.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), pool, "", s.Migrations()...); err != nil {
		tb.Fatal(err)
	}
	return s
}

// claimTx claims keys in a transaction, runs effect with the verdicts in the
// same transaction, commits and reports the committed verdicts.
func claimTx(tb testing.TB, pool *pgxpool.Pool, s *highwater.Strategy, keys []dedupe.Key,
	effect func(tx pgx.Tx, verdicts []dedupe.Verdict) error) []dedupe.Verdict {
	tb.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer tx.Rollback(ctx)
	verdicts, err := s.Claim(ctx, tx, keys)
	if err != nil {
		tb.Fatalf("claim %v: %v", keys, err)
	}
	if len(verdicts) != len(keys) {
		tb.Fatalf("%d verdicts for %d keys", len(verdicts), len(keys))
	}
	if effect != nil {
		if err := effect(tx, verdicts); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		tb.Fatal(err)
	}
	s.Committed(keys, verdicts)
	return verdicts
}

func key(sender string, seq int64) dedupe.Key {
	return dedupe.Key{Scope: "test", Sender: sender, Seq: seq}
}

// marks reads the marks table of the default configuration.
func marks(tb testing.TB, pool *pgxpool.Pool, table string) map[string]int64 {
	tb.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT sender, seq FROM `+pgx.Identifier{pg.DefaultSchema, table}.Sanitize()+` WHERE seq > 0`)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]int64{}
	var sender string
	var seq int64
	if _, err := pgx.ForEachRow(rows, []any{&sender, &seq}, func() error { out[sender] = seq; return nil }); err != nil {
		tb.Fatal(err)
	}
	return out
}

func verdictNames(vs []dedupe.Verdict) string {
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.String()
	}
	return strings.Join(names, " ")
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
