package cli_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's database.
type env struct {
	t    *testing.T
	url  string
	pool *pgxpool.Pool
}

func newEnv(t *testing.T) *env {
	t.Helper()
	url := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (msg_id text NOT NULL, payload bytea NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, url: url, pool: pool}
}

// result is what one command printed.
type result struct {
	out, err string
}

// run executes the command tree with args against the test's database,
// with stdin as its input.
func (e *env) run(opts cli.Options, stdin string, args ...string) (result, error) {
	root := cli.NewRoot(opts)
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(append([]string{"--database-url", e.url}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return result{out.String(), errb.String()}, err
}

// must runs a command that must succeed.
func (e *env) must(opts cli.Options, args ...string) result {
	e.t.Helper()
	r, err := e.run(opts, "", args...)
	if err != nil {
		e.t.Fatalf("effectively %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, r.out, r.err)
	}
	return r
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func insertEffect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, payload) VALUES ($1, $2)`, m.ID, m.Value)
	return err
}

// fixable refuses payloads starting with "bad" permanently until fixed.
type fixable struct {
	mu    sync.Mutex
	fixed bool
}

func (f *fixable) handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	f.mu.Lock()
	fixed := f.fixed
	f.mu.Unlock()
	if bytes.HasPrefix(m.Value, []byte("bad")) && !fixed {
		return consumer.Permanent(errMsg("cannot handle " + string(m.Value)))
	}
	return insertEffect(ctx, tx, m)
}

func (f *fixable) fix() {
	f.mu.Lock()
	f.fixed = true
	f.mu.Unlock()
}

type errMsg string

func (e errMsg) Error() string { return string(e) }

// consume runs a consumer named scope over msgs on an in-memory broker
// until all are settled. The tables are created with the migrate command
// beforehand.
func (e *env) consume(scope string, h consumer.Handler, msgs ...consumer.Message) {
	e.t.Helper()
	b := consumertest.New(consumertest.Config{Lanes: 1})
	for _, m := range msgs {
		b.Publish(0, m)
	}
	s, err := idset.New(idset.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := consumer.New(e.pool, b, consumer.Config{Name: scope, Strategy: s, Handler: h, RetryBackoff: time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	werr := b.WaitIdle(wctx)
	cancel()
	if err := <-done; err != nil {
		e.t.Fatal(err)
	}
	if werr != nil {
		e.t.Fatal(werr)
	}
}
