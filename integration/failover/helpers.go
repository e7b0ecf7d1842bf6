package failover

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	messages  = 3000 // logical messages, each published once, every tenth twice
	batchSize = 50
)

// dbName is the database every test uses on its own pair of servers.
const dbName = "app"

// pair is a primary and its standby, the test database on them, and a pool
// with the multi-host connection string an application uses.
type pair struct {
	t    *testing.T
	s    servers
	pool *pgxpool.Pool
}

// startPair starts a primary and a streaming standby (pgtest), with
// synchronous or asynchronous replication, and the test database.
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
	return newPair(t, replicated{r})
}

// newPair creates the test database and its effects table on s.
func newPair(t *testing.T, s servers) *pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := s.createDatabase(ctx, dbName)
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
	return &pair{t: t, s: s, pool: pool}
}

// reconnect replaces the pool with a new one, as a restarted process of
// the application makes.
func (p *pair) reconnect() {
	p.t.Helper()
	pool, err := pgxpool.New(context.Background(), p.s.url(dbName))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(pool.Close)
	p.pool = pool
}

// on returns the URL of the test database on the server whose "postgres"
// database serverURL names, bypassing the multi-host string.
func (p *pair) on(serverURL string) string {
	u, err := url.Parse(serverURL)
	if err != nil {
		p.t.Fatal(err)
	}
	u.Path = "/" + dbName
	return u.String()
}

// effects returns how many effect rows each message ID has on the server
// whose "postgres" database serverURL names.
func (p *pair) effects(serverURL string) map[string]int {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.on(serverURL))
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
	if err := p.s.killPrimary(); err != nil {
		p.t.Fatal(err)
	}
	g.arm()
	killed := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.s.promote(ctx); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("the standby accepts writes %v after the primary was killed", time.Since(killed).Round(time.Millisecond))
	promoted := p.effects(p.s.standby())
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
	if err := p.s.catchUp(ctx); err != nil {
		p.t.Fatal(err)
	}
	if err := p.s.stopStreaming(ctx); err != nil {
		p.t.Fatal(err)
	}
	cut, _, _ = h.counts()
	g.release()
	h.waitApplied(p.t, cut+5*batchSize)
	g.hold(p.t)
	return cut, p.effects(p.s.primary())
}

// cutOffUnacknowledged is cutOff for a consumer with StandbyAck on, which
// acknowledges nothing the standby lacks: it holds the consumer until
// every batch in flight waits in a handler (so no batch waits for the
// standby), lets the standby catch up and cuts it off, then lets the
// consumer commit at least a batch's worth of effects on the primary
// alone, and holds its handlers again. It returns how many messages were
// applied (acknowledged) at the cut, and the primary's effects at the
// end. Without StandbyAck, the batches committed after the cut are
// acknowledged as they commit.
func (p *pair) cutOffUnacknowledged(h *progress, g *gate) (cut int, before map[string]int) {
	p.t.Helper()
	g.holdAll(p.t, h)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.s.catchUp(ctx); err != nil {
		p.t.Fatal(err)
	}
	if err := p.s.stopStreaming(ctx); err != nil {
		p.t.Fatal(err)
	}
	cut, _, _ = h.counts()
	atCut := rows(p.effects(p.s.primary()))
	g.release()
	p.waitEffects(p.s.primary(), atCut+batchSize)
	// No handler passes from now on. (With StandbyAck, the workers may all
	// be waiting for the standby, none at the gate.)
	g.arm()
	return cut, p.effects(p.s.primary())
}

// waitEffects waits until the server whose "postgres" database serverURL
// names holds at least n effect rows.
// Batches waiting for their standbys report nothing to wait on: the
// server is asked every 20ms.
func (p *pair) waitEffects(serverURL string, n int) {
	p.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := rows(p.effects(serverURL))
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%d effects after a minute, want at least %d", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newStandby gives the server that accepts writes now (the promoted
// standby) a standby of its own, as an HA manager does (or waits until the
// manager has), so that a consumer with StandbyAck on has its commits
// confirmed again.
func (p *pair) newStandby() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stop, err := p.s.newStandby(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() {
		if err := stop(); err != nil {
			p.t.Error(err)
		}
	})
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
	final := p.effects(p.s.standby())
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
	fenced  int // batches dropped because the lane was fenced (Kafka: the offsets table went back)
	// unconfirmed counts the batches acknowledged unconfirmed by
	// StandbyAck's standbys, handedBack those it handed back.
	unconfirmed, handedBack int
	// started and done count the batches begun and reported: the
	// difference is the batches in flight.
	started, done int
	changed       chan struct{}
}

func newProgress() *progress { return &progress{changed: make(chan struct{})} }

func (h *progress) BatchStart(ctx context.Context, _ consumer.BatchInfo) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.started++
	close(h.changed)
	h.changed = make(chan struct{})
	return ctx
}

func (h *progress) BatchDone(_ context.Context, s *consumer.BatchStats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done++
	h.applied += s.Applied
	h.unknown += s.Unknown
	if s.Err != nil {
		h.errs++
	}
	if s.Fenced {
		h.fenced++
	}
	if s.StandbyUnconfirmed {
		h.unconfirmed++
	}
	if errors.Is(s.Err, standby.ErrUnconfirmed) {
		h.handedBack++
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
	// waiting counts the handlers waiting at the held gate; moved is
	// closed and replaced when it changes.
	waiting int
	moved   chan struct{}
}

func newGate() *gate { return &gate{inside: make(chan struct{}, 1), moved: make(chan struct{})} }

// count adds d to the handlers waiting at the gate. g.mu is not held.
func (g *gate) count(d int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waiting += d
	close(g.moved)
	g.moved = make(chan struct{})
}

// holdAll makes the handlers wait, and returns once every batch in flight
// (begun and not yet reported, as h counts them) waits at the gate, and at
// least one does: none is then committing or waiting to be acknowledged.
// A lane whose messages have all been consumed has no batch in flight, so
// the number that wait is not known in advance: with the consumer's
// Concurrency, at most that many.
func (g *gate) holdAll(t *testing.T, h *progress) {
	t.Helper()
	g.arm()
	timeout := time.After(time.Minute)
	for {
		g.mu.Lock()
		waiting, moved := g.waiting, g.moved
		g.mu.Unlock()
		h.mu.Lock()
		inFlight, changed := h.started-h.done, h.changed
		h.mu.Unlock()
		if waiting > 0 && waiting == inFlight {
			return
		}
		select {
		case <-moved:
		case <-changed:
		case <-timeout:
			t.Fatalf("after a minute %d handlers wait at the gate and %d batches are in flight, want all of them there", waiting, inFlight)
		}
	}
}

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
	g.count(1)
	defer g.count(-1)
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
