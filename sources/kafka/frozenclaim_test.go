package kafka

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// freezeAtCommit is a pgx tracer that stops the goroutine sending a
// transaction's COMMIT, once armed, until released: the process frozen
// between its last statement and its COMMIT, as a stopped worker or a
// long pause leaves it. The server sees the transaction idle, holding
// its locks.
type freezeAtCommit struct {
	mu      sync.Mutex
	armed   bool
	caught  chan struct{}
	release chan struct{}
}

func newFreezeAtCommit() *freezeAtCommit {
	return &freezeAtCommit{caught: make(chan struct{}), release: make(chan struct{})}
}

func (f *freezeAtCommit) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.EqualFold(strings.TrimSpace(data.SQL), "commit") {
		return ctx
	}
	f.mu.Lock()
	armed := f.armed
	f.armed = false
	f.mu.Unlock()
	if armed {
		close(f.caught)
		<-f.release
	}
	return ctx
}

func (f *freezeAtCommit) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A member frozen between its claim's statement and the claim's COMMIT
// holds the locks of the rows it claimed. The claim transaction sets
// idle_in_transaction_session_timeout, so the server ends the frozen
// session and another member claims the partitions while the first is
// still frozen (before, they stayed locked, reported busy, for as long as
// the freeze lasted). The frozen claim, once woken, commits nothing.
func TestClaimFrozenBeforeCommitReleasesItsRows(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	freeze := newFreezeAtCommit()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = freeze
	frozenPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(frozenPool.Close)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	schema, table := offsetsName("", "")
	if _, err := pg.Migrate(ctx, pool, "", OffsetsLine(schema, table)); err != nil {
		t.Fatal(err)
	}
	tps := []topicPartition{{"orders", 0}, {"orders", 1}}
	// The rows exist, as after the group's first generation.
	if _, _, err := newOffsetStore(pool, "ledger", schema, table).claim(ctx, 1, tps); err != nil {
		t.Fatal(err)
	}

	frozen := newOffsetStore(frozenPool, "ledger", schema, table)
	frozen.claimIdle = time.Second
	freeze.mu.Lock()
	freeze.armed = true
	freeze.mu.Unlock()
	woken := make(chan error, 1)
	go func() {
		_, _, err := frozen.claim(ctx, 2, tps)
		woken <- err
	}()
	select {
	case <-freeze.caught:
	case <-ctx.Done():
		t.Fatal("the claim never reached its COMMIT")
	}
	released := false
	defer func() {
		if !released {
			close(freeze.release)
		}
	}()

	// Another member claims the partitions while the first is frozen.
	other := newOffsetStore(pool, "ledger", schema, table)
	for {
		claimed, busy, err := other.claim(ctx, 3, tps)
		if ctx.Err() != nil {
			t.Fatalf("the partitions stayed locked by the frozen claim: busy %v, err %v", busy, err)
		}
		if err != nil && !errors.Is(err, errClaimBusy) {
			t.Fatal(err)
		}
		if err == nil && len(busy) == 0 && len(claimed) == len(tps) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the partitions stayed locked by the frozen claim: busy %v, err %v", busy, err)
		case <-time.After(50 * time.Millisecond): // claiming again, as the source does
		}
	}

	close(freeze.release)
	released = true
	if err := <-woken; err == nil {
		t.Fatal("the frozen claim committed after its session was ended")
	}
	var gen int
	if err := pool.QueryRow(ctx, `SELECT min(generation) FROM `+pgx.Identifier{schema, table}.Sanitize()+` WHERE group_id = 'ledger'`).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	if gen != 3 {
		t.Fatalf("the rows' generation is %d, want 3 (the member that claimed them while the other was frozen)", gen)
	}
}
