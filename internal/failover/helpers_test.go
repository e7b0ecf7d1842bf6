package failover

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dbName is the database every test uses on its own pair of servers.
const dbName = "app"

// pair is a primary and its standby, the test database on them, and a pool
// with the multi-host connection string an application uses.
type pair struct {
	t    *testing.T
	r    *pgtest.Replicated
	pool *pgxpool.Pool
}

func startPair(t *testing.T, synchronous bool) *pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := pgtest.StartReplicated(ctx, pgtest.ReplicaOptions{Synchronous: synchronous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	})
	dsn, err := r.CreateDatabase(ctx, dbName)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL)`); err != nil {
		t.Fatal(err) // deliberately no unique constraint: a second effect must be countable
	}
	return &pair{t: t, r: r, pool: pool}
}

// reconnect replaces the pool with a new one, as a restarted process of
// the application makes.
func (p *pair) reconnect() {
	p.t.Helper()
	pool, err := pgxpool.New(context.Background(), p.r.URL(dbName))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(pool.Close)
	p.pool = pool
}

// on returns the URL of the test database on one server, bypassing the
// multi-host string.
func (p *pair) on(c *pgtest.Cluster) string {
	u, err := url.Parse(c.URL())
	if err != nil {
		p.t.Fatal(err)
	}
	u.Path = "/" + dbName
	return u.String()
}

// effects returns how many effect rows each message ID has on the server c.
func (p *pair) effects(c *pgtest.Cluster) map[string]int {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.on(c))
	if err != nil {
		p.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT msg_id, count(*) FROM effects GROUP BY msg_id`)
	if err != nil {
		p.t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			p.t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		p.t.Fatal(err)
	}
	return out
}

// killAndPromote crashes the primary, promotes the standby and returns
// the effects the promoted standby holds before the consumer, held at g
// from the kill on (if not before), goes on.
func (p *pair) killAndPromote(g *gate) map[string]int {
	p.t.Helper()
	if err := p.r.KillPrimary(); err != nil {
		p.t.Fatal(err)
	}
	g.arm()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.r.Promote(ctx); err != nil {
		p.t.Fatal(err)
	}
	promoted := p.effects(p.r.Standby)
	g.release()
	return promoted
}

// cutOff stops the standby's streaming once it has caught up with what
// was applied, holding the consumer at g meanwhile, then lets at least
// five more batches commit (and be acknowledged) on the primary alone,
// and holds the consumer again. It returns how many messages were applied
// at the cut, and the primary's effects at the end: the commits a
// promoted standby will lack.
func (p *pair) cutOff(h *progress, g *gate) (cut int, before map[string]int) {
	p.t.Helper()
	g.hold(p.t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.r.CatchUp(ctx); err != nil {
		p.t.Fatal(err)
	}
	if err := p.r.StopStreaming(ctx); err != nil {
		p.t.Fatal(err)
	}
	cut, _, _ = h.counts()
	g.release()
	h.waitApplied(p.t, cut+5*batchSize)
	g.hold(p.t)
	return cut, p.effects(p.r.Primary)
}

// expectEach fails t unless final holds exactly one effect of each of the
// workload's messages.
func expectEach(t *testing.T, final map[string]int) {
	t.Helper()
	if len(final) != messages || rows(final) != messages {
		t.Errorf("%d effect rows for %d distinct messages, want %d of each; applied twice: %v", rows(final), len(final), messages, twice(final))
	}
}

// expectKept fails t when the promoted standby lacks effects that were
// reported applied before the kill: with synchronous replication every
// acknowledged COMMIT is on the standby too.
func expectKept(t *testing.T, promoted map[string]int, appliedAtKill int) {
	t.Helper()
	if rows(promoted) < appliedAtKill {
		t.Errorf("the promoted standby has %d effects, fewer than the %d reported applied before the kill", rows(promoted), appliedAtKill)
	}
}

// expectLoss stops t unless the promoted standby lacks some of the
// effects the primary had at the kill: an asynchronous test that lost
// nothing proves nothing.
func expectLoss(t *testing.T, promoted, before map[string]int) {
	t.Helper()
	if rows(promoted) >= rows(before) {
		t.Fatalf("the promoted standby has %d effects and the primary had %d: no commit was lost, the test proves nothing", rows(promoted), rows(before))
	}
}

// synchronousRun is the synchronous test of a source: it lets the consumer
// apply a third of the workload, kills the primary and promotes the
// standby, lets finish (wait for the rest and stop the consumer), logs
// what happened and checks that the promoted standby kept every reported
// effect and that every message ends with exactly one effect.
func (p *pair) synchronousRun(h *progress, g *gate, finish func()) {
	t := p.t
	t.Helper()
	h.waitApplied(t, messages/3)
	appliedAtKill, _, _ := h.counts()
	promoted := p.killAndPromote(g)
	finish()
	final := p.effects(p.r.Standby)
	_, unknown, errs := h.counts()
	t.Logf("N=%d (%d published): %d reported applied at the kill, %d effects on the standby once promoted, %d at the end; %d batches rolled back by the switch, %d messages with an unknown COMMIT outcome",
		messages, messages+messages/10, appliedAtKill, rows(promoted), rows(final), errs, unknown)
	expectKept(t, promoted, appliedAtKill)
	expectEach(t, final)
}

// rows sums the effect rows of counts.
func rows(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// twice returns the IDs with more than one effect.
func twice(counts map[string]int) []string {
	var out []string
	for id, c := range counts {
		if c > 1 {
			out = append(out, fmt.Sprintf("%s×%d", id, c))
		}
	}
	return out
}

// progress is a consumer hook counting what the batches reported: applied
// messages (committed and acknowledged), unknown COMMIT outcomes and
// batches rolled back by an error. Tests wait on it for events.
type progress struct {
	mu      sync.Mutex
	applied int
	unknown int
	errs    int
	changed chan struct{}
}

func newProgress() *progress { return &progress{changed: make(chan struct{})} }

func (h *progress) BatchDone(_ context.Context, s *consumer.BatchStats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.applied += s.Applied
	h.unknown += s.Unknown
	if s.Err != nil {
		h.errs++
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *progress) counts() (applied, unknown, errs int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.applied, h.unknown, h.errs
}

// waitApplied waits until at least n messages were reported applied, and
// returns how many were.
func (h *progress) waitApplied(t *testing.T, n int) int {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		h.mu.Lock()
		applied, changed := h.applied, h.changed
		h.mu.Unlock()
		if applied >= n {
			return applied
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("%d messages applied after a minute, want at least %d", applied, n)
		}
	}
}

// gate holds the handlers back while it is held, so that the primary is
// killed (or the standby cut off) with batches in the middle of their
// transactions and no commit in between.
type gate struct {
	mu     sync.Mutex
	open   chan struct{} // while held, closed by release; nil otherwise
	inside chan struct{} // receives when a handler waits at the held gate
}

func newGate() *gate { return &gate{inside: make(chan struct{}, 1)} }

// pass is called by a handler before its statement: while the gate is
// held it waits until it is released.
func (g *gate) pass(ctx context.Context) {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	if open == nil {
		return
	}
	select {
	case g.inside <- struct{}{}:
	default:
	}
	select {
	case <-open:
	case <-ctx.Done():
	}
}

// hold makes the handlers wait, and returns once one waits at the gate,
// inside its batch's transaction.
func (g *gate) hold(t *testing.T) {
	t.Helper()
	g.arm()
	select {
	case <-g.inside:
	case <-time.After(time.Minute):
		t.Fatal("no handler reached the gate within a minute")
	}
}

// arm makes the handlers wait from now on, if they do not already.
func (g *gate) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open != nil {
		return
	}
	g.open = make(chan struct{})
	select {
	case <-g.inside: // from an earlier hold
	default:
	}
}

// release lets the held handlers go on.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.open)
	g.open = nil
}
