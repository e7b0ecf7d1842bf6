package idempotency_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// TestBloom runs the middleware on the bloom strategy: replay, mismatch
// and one effect per key.
func TestBloom(t *testing.T) {
	t.Parallel()
	s, err := bloom.New(bloom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.NewPool(t)
	e := newEnvPool(t, pool, idempotency.Config{SingleTenant: true, Strategy: s}, nil)
	if err := e.mw.Maintain(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := e.post(t, "k1", `{"amount":5,"to":"x"}`)
	wantStatus(t, first, http.StatusCreated)
	again := e.post(t, "k1", `{ "to":"x", "amount":5 }`)
	if !bytes.Equal(again.body, first.body) || again.header.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("replay: %d %s", again.status, again.body)
	}
	wantStatus(t, e.post(t, "k1", `{"amount":6,"to":"x"}`), http.StatusUnprocessableEntity)
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// hookRecorder is a consumer hook that records what it is told.
type hookRecorder struct {
	mu       sync.Mutex
	started  int
	outcomes []consumer.Outcome
	stats    []consumer.BatchStats
	reported chan struct{} // one per MessageDone
}

func (h *hookRecorder) BatchStart(ctx context.Context, b consumer.BatchInfo) context.Context {
	h.mu.Lock()
	h.started++
	h.mu.Unlock()
	return ctx
}

func (h *hookRecorder) BatchDone(_ context.Context, s *consumer.BatchStats) {
	h.mu.Lock()
	h.stats = append(h.stats, *s)
	h.mu.Unlock()
}

func (h *hookRecorder) MessageDone(_ context.Context, e consumer.MessageEvent) {
	h.mu.Lock()
	h.outcomes = append(h.outcomes, e.Outcome)
	h.mu.Unlock()
	h.reported <- struct{}{}
}

// TestHooks: each request with a key is reported to the consumer's hooks
// as a batch of one message, with its outcome.
func TestHooks(t *testing.T) {
	t.Parallel()
	h := &hookRecorder{reported: make(chan struct{}, 10)}
	e := newEnv(t, idempotency.Config{SingleTenant: true, Name: "payments-api", Hooks: []consumer.Hook{h}}, nil)
	for _, r := range []struct{ key, body string }{
		{"k1", `{"amount":5,"to":"x"}`},  // applied
		{"k1", `{"amount":5,"to":"x"}`},  // duplicate
		{"k1", `{"amount":6,"to":"x"}`},  // mismatch
		{"k2", `{"amount":-1,"to":"x"}`}, // 400, not final: retried
	} {
		e.post(t, r.key, r.body)
		<-h.reported
	}
	e.post(t, "", `{"amount":1,"to":"x"}`) // no key: not reported (checked below by the counts)
	h.mu.Lock()
	defer h.mu.Unlock()
	want := []consumer.Outcome{consumer.OutcomeApplied, consumer.OutcomeDuplicate, consumer.OutcomeMismatch, consumer.OutcomeRetried}
	if h.started != len(want) || len(h.stats) != len(want) {
		t.Fatalf("%d started, %d done, want %d", h.started, len(h.stats), len(want))
	}
	for i, o := range want {
		if h.outcomes[i] != o {
			t.Errorf("request %d: outcome %v, want %v", i, h.outcomes[i], o)
		}
		s := h.stats[i]
		if s.Consumer != "payments-api" || s.Strategy != idempotency.ResponsesStrategy || s.Size != 1 || s.Lane != "POST /payments" {
			t.Errorf("request %d: batch info %+v", i, s.BatchInfo)
		}
	}
	if h.stats[0].Applied != 1 || h.stats[1].Duplicate != 1 || h.stats[2].Mismatch != 1 || h.stats[3].Retried != 1 || h.stats[3].Err == nil {
		t.Errorf("counts: %+v", h.stats)
	}
}

// TestSweepAndRun: responses older than the retention are swept, by Sweep
// and by Run, which returns nil when its context ends.
func TestSweepAndRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	ctx := context.Background()
	for _, k := range []string{"old1", "old2", "new"} {
		wantStatus(t, e.post(t, k, `{"amount":1,"to":"x"}`), http.StatusCreated)
	}
	// The strategy's default retention is 7 days; responses are kept an
	// hour longer.
	if _, err := e.pool.Exec(ctx, `UPDATE effectively.idempotency_responses SET created_at = now() - interval '7 days 2 hours' WHERE key LIKE 'old%'`); err != nil {
		t.Fatal(err)
	}
	n, err := e.mw.Sweep(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Sweep: %d, %v; want 2", n, err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE effectively.idempotency_responses SET created_at = now() - interval '8 days'`); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.mw.Run(runCtx) }()
	for e.stored(t) != 0 { // Run sweeps at once
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestMigrations: the responses line, after the strategy's when there is
// one, printable.
func TestMigrations(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	mw, err := idempotency.New(pool, idempotency.Config{SingleTenant: true, Schema: "api", Table: "responses"})
	if err != nil {
		t.Fatal(err)
	}
	if lines := mw.Migrations(); len(lines) != 1 || lines[0].Name != "idempotency:api.responses" {
		t.Fatalf("lines without a strategy %+v", lines)
	}
	s, err := idempotency.DefaultStrategy()
	if err != nil {
		t.Fatal(err)
	}
	mw, err = idempotency.New(pool, idempotency.Config{SingleTenant: true, Schema: "api", Table: "responses", Strategy: s})
	if err != nil {
		t.Fatal(err)
	}
	lines := mw.Migrations()
	if len(lines) != 2 || lines[0].Name != "idset:effectively.processed" || lines[1].Name != "idempotency:api.responses" {
		t.Fatalf("lines %+v", lines)
	}
	sql, err := pg.MigrationSQL("", lines...)
	if err != nil || !strings.Contains(sql, `CREATE TABLE "api"."responses"`) {
		t.Fatalf("MigrationSQL: %v\n%s", err, sql)
	}
}

// TestPgBouncer runs a replay and a 409 through PgBouncer in
// transaction pooling: the lock is transaction-level and no statement
// keeps session state.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewBouncerPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		c.MaxConns = 8
	})
	g := newGated()
	e := newEnvPool(t, pool, idempotency.Config{SingleTenant: true}, g)
	t.Cleanup(g.open)
	first := e.post(t, "k1", `{"amount":5,"to":"x"}`)
	wantStatus(t, first, http.StatusCreated)
	if again := e.post(t, "k1", `{"amount":5,"to":"x"}`); !bytes.Equal(again.body, first.body) {
		t.Fatalf("replay: %d %s", again.status, again.body)
	}
	done := make(chan reply, 1)
	go func() { done <- e.post(t, "k2", `{"amount":5,"to":"gate"}`) }()
	<-g.entered
	wantStatus(t, e.post(t, "k2", `{"amount":5,"to":"gate"}`), http.StatusConflict)
	g.open()
	wantStatus(t, <-done, http.StatusCreated)
	if n := e.count(t, "true"); n != 2 {
		t.Fatalf("%d payments, want 2", n)
	}
}

// plainDB hides everything of a pool but pg.DB: the middleware then
// takes the lock and stores the response as statements of their own.
type plainDB struct{ pg.DB }

// beginTxDB adds BeginTx (as *pgx.Conn has) but not Acquire.
type beginTxDB struct{ *pgxpool.Pool }

func (b beginTxDB) Acquire() {} // not pgxpool's Acquire: hides it

// TestDBShapes runs a replay, a 409 and a rolled-back 4xx through each way
// the middleware reaches the database.
func TestDBShapes(t *testing.T) {
	t.Parallel()
	for _, shape := range []string{"pool", "BeginTx only", "pg.DB only"} {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.NewPool(t)
			var db pg.DB = pool
			switch shape {
			case "BeginTx only":
				db = beginTxDB{pool}
			case "pg.DB only":
				db = plainDB{pool}
			}
			g := newGated()
			e := newEnvDB(t, pool, db, idempotency.Config{SingleTenant: true}, g)
			t.Cleanup(g.open)
			first := e.post(t, "k1", `{"amount":5,"to":"x"}`)
			wantStatus(t, first, http.StatusCreated)
			if again := e.post(t, "k1", `{"amount":5,"to":"x"}`); !bytes.Equal(again.body, first.body) {
				t.Fatalf("replay: %d %s", again.status, again.body)
			}
			wantStatus(t, e.post(t, "k3", `{"amount":-5,"to":"x"}`), http.StatusBadRequest)
			done := make(chan reply, 1)
			go func() { done <- e.post(t, "k2", `{"amount":5,"to":"gate"}`) }()
			<-g.entered
			for range 3 { // the connection of a refused lock is usable again
				wantStatus(t, e.post(t, "k2", `{"amount":5,"to":"gate"}`), http.StatusConflict)
			}
			g.open()
			wantStatus(t, <-done, http.StatusCreated)
			if n := e.count(t, "true"); n != 2 {
				t.Fatalf("%d payments, want 2", n)
			}
		})
	}
}

// TestTransient: a transient failure of the middleware's own statement (a
// lock_timeout on the responses table, held by another session) answers 503
// with Retry-After and leaves nothing; the retry then succeeds once.
func TestTransient(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "100ms"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := newEnvPool(t, pool, idempotency.Config{SingleTenant: true}, nil)
	ctx := context.Background()
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locker.Exec(ctx, `LOCK TABLE effectively.idempotency_responses IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	r := e.post(t, "k1", `{"amount":5,"to":"x"}`)
	wantStatus(t, r, http.StatusServiceUnavailable)
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, m := e.count(t, "true"), e.markers(t); n+m != 0 {
		t.Fatalf("after a 503: %d payments, %d markers", n, m)
	}
	wantStatus(t, e.post(t, "k1", `{"amount":5,"to":"x"}`), http.StatusCreated)
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}
