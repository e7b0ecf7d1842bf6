package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// One invariant run: a plan published to a broker, consumed by a consumer
// over several lifetimes while faults strike, then the ledger checked.

// invStrategy is a strategy under test; each consumer lifetime makes a new
// one, as a restarted process would, with its tables in the run's schema.
type invStrategy struct {
	name    string
	make    func(schema string) (dedupe.Strategy, error)
	keyFunc consumer.KeyFunc
	// ordered: a sender's messages apply in seq order (highwater).
	ordered bool
}

var invStrategies = []invStrategy{
	{name: "idset", make: func(schema string) (dedupe.Strategy, error) { return idset.New(idset.Config{Schema: schema}) }},
	{name: "highwater-strict", keyFunc: seqKey, ordered: true, make: func(schema string) (dedupe.Strategy, error) {
		return highwater.New(highwater.Config{Schema: schema, Mode: highwater.Strict})
	}},
	{name: "highwater-monotonic", keyFunc: seqKey, ordered: true, make: func(schema string) (dedupe.Strategy, error) {
		return highwater.New(highwater.Config{Schema: schema, Mode: highwater.Monotonic})
	}},
	{name: "bloom", make: func(schema string) (dedupe.Strategy, error) {
		// A short retention: at start-up the strategy builds the filter of
		// every slice in it, one transaction each.
		return bloom.New(bloom.Config{Schema: schema, Slice: time.Minute, Retention: 3 * time.Minute, ExpectedKeysPerSlice: 10_000})
	}},
}

const (
	// invMaxAttempts: a good message fails at most a few times (its
	// transient failures, a kill or a crash), far fewer than this.
	invMaxAttempts = 10
)

// Limits of a run, overridable for debugging with INVARIANT_STALL and
// INVARIANT_DEADLINE (Go durations). They guard against a hung test; they
// are not performance assertions: a healthy run acknowledges something
// every few milliseconds and ends within seconds.
var (
	invStall    = envDuration("INVARIANT_STALL", 10*time.Second)
	invDeadline = envDuration("INVARIANT_DEADLINE", 90*time.Second)
)

var errInvCrash = errors.New("consumer crashed mid-handler")

// invRun is the state of one run.
type invRun struct {
	t      *testing.T
	p      *plan
	strat  invStrategy
	shape  string // Handler, QueueHandler or BatchHandler
	schema string // holds every table of the run
	app    string // application_name of the consumer's connections: the only ones killed
	pool   *pgxpool.Pool
	admin  *pgxpool.Pool
	broker *consumertest.Broker
	hooks  consumertest.Counter

	kills  sync.WaitGroup // asynchronous kills still running
	leaked atomic.Bool    // a Run that did not return when cancelled

	mu          sync.Mutex
	refs        map[int]string  // serial → the ref the broker gave it
	fired       map[[2]int]bool // (serial, attempt) of faults that struck
	failedOnce  map[[2]int]bool // (serial, attempt) of deliveries that failed transiently
	transients  map[string]int  // by logical message: deliveries that failed transiently
	events      map[int][]string
	reported    map[int]bool // serials the hook saw parked
	violations  []string
	lifetime    int
	batches     int // over the whole run
	lifeBatches int
	stopLife    context.CancelFunc
	stats       invStats
	commitKills map[string][]*commitKill // by lane, in BeforeCommit order
	abandoned   map[string][]*stored     // by lane: the last settled batch's abandoned messages
}

// invStats counts what a run did, to show that the runs exercised every
// fault (summed over the seeds of a configuration).
type invStats struct {
	lifetimes, runErrors                    int
	killHandler, killCommit, killAll, crash int
	dropCommit                              int
	commitKilledButCommitted                int // a COMMIT whose reply was lost (or whose session was killed) that landed
	unknownOutcome                          int // of them, reported failed: the consumer could not find out
	broker                                  consumertest.Stats
	totals                                  consumertest.Totals
}

func (s *invStats) add(o invStats) {
	s.lifetimes += o.lifetimes
	s.runErrors += o.runErrors
	s.killHandler += o.killHandler
	s.killCommit += o.killCommit
	s.killAll += o.killAll
	s.dropCommit += o.dropCommit
	s.crash += o.crash
	s.commitKilledButCommitted += o.commitKilledButCommitted
	s.unknownOutcome += o.unknownOutcome
	s.broker.Published += o.broker.Published
	s.broker.Delivered += o.broker.Delivered
	s.broker.Duplicated += o.broker.Duplicated
	s.broker.LostAcks += o.broker.LostAcks
	s.broker.Crashes += o.broker.Crashes
	s.broker.Retried += o.broker.Retried
	s.totals.Batches += o.totals.Batches
	s.totals.Parked += o.totals.Parked
	s.totals.Duplicate += o.totals.Duplicate
	s.totals.Isolated += o.totals.Isolated
	s.totals.Failed += o.totals.Failed
}

func (s invStats) String() string {
	return fmt.Sprintf("%d batches in %d lifetimes (%d ended by a Run error); kills: %d mid-handler, %d at commit, %d of the whole pool; %d connections lost after COMMIT was sent; of the %d commits aimed at, %d committed, %d of them reported failed; %d crashes mid-handler; broker: %d published, %d delivered, %d duplicated, %d lost acks, %d crashes; batches: %d isolated, %d failed; %d duplicates, %d parked",
		s.totals.Batches, s.lifetimes, s.runErrors, s.killHandler, s.killCommit, s.killAll, s.dropCommit, s.killCommit+s.dropCommit, s.commitKilledButCommitted, s.unknownOutcome, s.crash,
		s.broker.Published, s.broker.Delivered, s.broker.Duplicated, s.broker.LostAcks, s.broker.Crashes,
		s.totals.Isolated, s.totals.Failed, s.totals.Duplicate, s.totals.Parked)
}

// invSource is the broker with a BeforeCommit, where killCommit faults strike.
type invSource struct {
	*consumertest.Broker
	r *invRun
}

var _ consumer.TxSource = invSource{}

// Settle records the deliveries of a batch that were neither acknowledged
// nor retried (the batch rolled back), which no MessageHook reports.
func (s invSource) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	settled := map[*consumer.Message]bool{}
	for _, m := range ack {
		settled[m] = true
	}
	for _, rt := range retry {
		settled[rt.Message] = true
	}
	var abandoned []*stored
	for _, m := range b.Messages {
		if !settled[m] {
			if st := s.r.storedOf(m); st != nil {
				abandoned = append(abandoned, st)
				s.r.mu.Lock()
				s.r.event(st, "a%d abandoned with its batch of %d", m.Attempt, len(b.Messages))
				s.r.mu.Unlock()
			}
		}
	}
	s.r.mu.Lock()
	s.r.abandoned[b.Lane] = abandoned
	s.r.mu.Unlock()
	return s.Broker.Settle(ctx, b, ack, retry)
}

func (s invSource) BeforeCommit(ctx context.Context, tx pgx.Tx, b *consumer.Batch, _ []*consumer.Message) error {
	return s.r.beforeCommit(ctx, tx, b)
}

// newInvRun makes the run's schema in the database at url (effects table
// with its deferred foreign key), the consumer's pool and the admin pool,
// and publishes the plan. Runs that share a database never overlap in time.
func newInvRun(t *testing.T, url string, p *plan, strat invStrategy, shape string) *invRun {
	ctx := context.Background()
	schema := fmt.Sprintf("inv_%d", p.seed)
	app := "effectively-invariant-" + schema
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	// A batch still running when its broker crashed can deadlock with its
	// lane's redelivery (a zombie and its successor): settle that in 20ms
	// rather than the default second.
	pcfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "20ms"
	pcfg.MaxConns = 8
	dial := pcfg.ConnConfig.DialFunc
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &dropConn{Conn: c}, nil
	}
	acfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	acfg.ConnConfig.RuntimeParams["application_name"] = "effectively-invariant-admin"
	acfg.ConnConfig.RuntimeParams["search_path"] = schema
	admin, err := pgxpool.NewWithConfig(ctx, acfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := admin.Exec(ctx, `DROP SCHEMA IF EXISTS `+q+` CASCADE; CREATE SCHEMA `+q+`;
CREATE TABLE accounts (id text PRIMARY KEY);
INSERT INTO accounts VALUES ('ok');
-- One row per applied message. No unique constraint: a second effect must be countable.
CREATE TABLE effects (
    n       bigint  GENERATED ALWAYS AS IDENTITY,
    logical text    NOT NULL,
    copy    integer NOT NULL,
    sender  text    NOT NULL,
    seq     bigint  NOT NULL,
    payload bytea,  -- NULL for a nil value
    -- A poison-at-commit message's row names a missing account: checked at COMMIT.
    account text    NOT NULL REFERENCES accounts (id) DEFERRABLE INITIALLY DEFERRED,
    stall   boolean NOT NULL
);
-- A row written by a delivery that a kill at commit is aimed at makes the
-- COMMIT take a little longer, so that the kill often lands inside it.
CREATE FUNCTION stall_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.005); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER effects_stall AFTER INSERT ON effects DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.stall) EXECUTE FUNCTION stall_commit();
`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() { // a failed run's tables stay for a look, until the database goes
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := admin.Exec(ctx, `DROP SCHEMA `+q+` CASCADE`); err != nil {
				t.Logf("dropping schema %s: %v", schema, err)
			}
		}
	})
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &invRun{
		t: t, p: p, strat: strat, shape: shape, schema: schema, app: app, pool: pool, admin: admin,
		broker: consumertest.New(consumertest.Config{
			Lanes: p.lanes, DuplicateRate: p.dupRate, LostAckRate: p.lostAck, Seed: p.seed,
			BinaryRefs: p.binary, RestartOffsetsEvery: p.recurEach,
		}),
		fired: map[[2]int]bool{}, failedOnce: map[[2]int]bool{}, transients: map[string]int{}, events: map[int][]string{}, reported: map[int]bool{},
		commitKills: map[string][]*commitKill{}, abandoned: map[string][]*stored{},
	}
	for lane, seq := range p.order {
		for _, s := range seq {
			r.broker.Publish(lane, s.msg())
		}
	}
	t.Cleanup(func() { // before the schema is dropped
		if !r.leaked.Load() {
			pool.Close()
		} // else Close would wait for the hung Run's connections; dropping the database ends them
	})
	r.refs = map[int]string{}
	for _, pm := range r.broker.Pending() {
		if s := r.storedOf(&pm.Message); s != nil {
			r.refs[s.serial] = pm.Message.Ref
		}
	}
	return r
}

// storedOf finds the stored message a delivery is a copy of.
func (r *invRun) storedOf(m *consumer.Message) *stored {
	v, _ := m.Header("x-copy")
	i, err := strconv.Atoi(string(v))
	if err != nil || i < 0 || i >= len(r.p.stored) {
		r.violation("delivery %s with no valid x-copy header %q", quoteRef(m.Ref), v)
		return nil
	}
	return r.p.stored[i]
}

func (r *invRun) violation(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.violations) < 50 {
		r.violations = append(r.violations, fmt.Sprintf(format, args...))
	}
}

// event adds to the history of s, keeping its first 10 and last 30
// events; r.mu must be held.
func (r *invRun) event(s *stored, format string, args ...any) {
	h := append(r.events[s.serial], fmt.Sprintf("L%d b%d ", r.lifetime, r.batches)+fmt.Sprintf(format, args...))
	if len(h) > 40 {
		h = append(h[:10], h[11:]...)
		h[10] = "…"
	}
	r.events[s.serial] = h
}

type effectRow struct {
	logical string
	copy    int
	sender  string
	seq     int64
	payload []byte
	account string
	stall   bool
}

// effect is the handler's logic for one message, shared by the three
// shapes: faults, poison and transient failures, and the row to write.
// kill terminates the handler's session.
func (r *invRun) effect(kill func(), m *consumer.Message) (effectRow, error) {
	s := r.storedOf(m)
	if s == nil {
		return effectRow{}, consumer.Permanent(errors.New("unknown message"))
	}
	l := s.logical
	if (m.Value == nil) != (l.value == nil) || !bytes.Equal(m.Value, l.value) {
		r.violation("%s: copy #%d delivered to the handler with value %s, published %s", l.id, s.serial, showValue(m.Value), showValue(l.value))
	}
	if r.strike(s, m.Attempt, crashHandler) {
		r.broker.Crash()
		return effectRow{}, errInvCrash
	}
	if r.strike(s, m.Attempt, killHandler) {
		kill()
	}
	switch {
	case l.kind == poisonPermanent:
		return effectRow{}, consumer.Permanent(fmt.Errorf("poison message %s", l.id))
	case l.kind == poisonExhaust:
		return effectRow{}, fmt.Errorf("poison message %s fails every time", l.id)
	case r.transient(s, m.Attempt):
		return effectRow{}, fmt.Errorf("transient failure of %s (copy #%d, attempt %d)", l.id, s.serial, m.Attempt)
	}
	row := effectRow{logical: l.id, copy: s.serial, sender: l.sender, seq: l.seq, payload: m.Value, account: "ok",
		stall: r.pending(s, m.Attempt, killCommit)}
	if l.kind == poisonCommit {
		row.account = "missing"
	}
	return row, nil
}

func (r *invRun) handler(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	row, err := r.effect(func() { r.kill(tx.Conn().PgConn().PID()) }, m)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO effects (logical, copy, sender, seq, payload, account, stall) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		row.logical, row.copy, row.sender, row.seq, row.payload, row.account, row.stall)
	return err
}

// queueHandler queues the effect. Its session is killed from within the
// pipeline: by a statement it queues before the effect.
func (r *invRun) queueHandler(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
	row, err := r.effect(func() { q.Queue(`SELECT pg_terminate_backend(pg_backend_pid())`) }, m)
	if err != nil {
		return err
	}
	q.Queue(`INSERT INTO effects (logical, copy, sender, seq, payload, account, stall) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		row.logical, row.copy, row.sender, row.seq, row.payload, row.account, row.stall)
	return nil
}

func (r *invRun) batchHandler(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	var (
		logicals, senders, accounts []string
		copies                      []int32
		seqs                        []int64
		payloads                    [][]byte
		stalls                      []bool
	)
	for _, m := range msgs {
		row, err := r.effect(func() { r.kill(tx.Conn().PgConn().PID()) }, m)
		if err != nil {
			return err
		}
		logicals, copies, senders, seqs = append(logicals, row.logical), append(copies, int32(row.copy)), append(senders, row.sender), append(seqs, row.seq)
		payloads, accounts, stalls = append(payloads, row.payload), append(accounts, row.account), append(stalls, row.stall)
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (logical, copy, sender, seq, payload, account, stall)
		SELECT * FROM unnest($1::text[], $2::integer[], $3::text[], $4::bigint[], $5::bytea[], $6::text[], $7::boolean[])`,
		logicals, copies, senders, seqs, payloads, accounts, stalls)
	return err
}

// BatchDone counts batches: it ends a lifetime after its planned number of
// batches, terminates the whole pool after the planned batch numbers, and
// notes whether a batch whose COMMIT was aimed at reported an error.
func (r *invRun) BatchDone(_ context.Context, st *consumer.BatchStats) {
	r.hooks.BatchDone(context.Background(), st)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches++
	r.lifeBatches++
	if st.Err != nil {
		for _, s := range r.abandoned[st.Lane] {
			r.event(s, "batch error: %v", st.Err)
		}
	}
	r.abandoned[st.Lane] = nil
	for _, k := range r.commitKills[st.Lane] {
		if !k.reported {
			k.reported, k.reportErr = true, st.Err != nil
			break
		}
	}
	if r.p.killAllAt[r.batches] {
		r.stats.killAll++
		r.kills.Add(1)
		go func() {
			defer r.kills.Done()
			r.killAll()
		}()
	}
	if i := min(r.lifetime-1, len(r.p.lifetimes)-1); r.lifeBatches >= r.p.lifetimes[i] && r.stopLife != nil {
		r.stopLife()
	}
}

// MessageDone keeps each stored message's history, and which were parked.
func (r *invRun) MessageDone(_ context.Context, e consumer.MessageEvent) {
	m, o, err := e.Message, e.Outcome, e.Err
	s := r.storedOf(m)
	if s == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if o == consumer.OutcomeParked {
		r.reported[s.serial] = true
	}
	switch {
	case err != nil:
		r.event(s, "a%d %s: %v", m.Attempt, o, err)
	case o == consumer.OutcomeRetried:
		r.event(s, "a%d %s (waiting behind its sender's earlier message)", m.Attempt, o)
	default:
		r.event(s, "a%d %s", m.Attempt, o)
	}
}

var _ consumer.MessageHook = (*invRun)(nil)

func (r *invRun) config() consumer.Config {
	s, err := r.strat.make(r.schema)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg := consumer.Config{
		Name:            "inv",
		Schema:          r.schema,
		Strategy:        s,
		KeyFunc:         r.strat.keyFunc,
		BatchSize:       r.p.batchSize,
		Concurrency:     4,
		MaxAttempts:     invMaxAttempts,
		RetryBackoff:    time.Millisecond,
		MaxRetryBackoff: 4 * time.Millisecond,
		GapDelay:        time.Millisecond,
		// Waiting behind a sender's poison message is not failing: a good
		// message must never be parked as a gap here.
		GapMaxAttempts:  1 << 30,
		ShutdownTimeout: 10 * time.Second,
		Logger:          consumertest.Logger(),
		Hooks:           []consumer.Hook{r},
	}
	switch r.shape {
	case "BatchHandler":
		cfg.BatchHandler = r.batchHandler
	case "QueueHandler":
		cfg.QueueHandler = r.queueHandler
	default:
		cfg.Handler = r.handler
	}
	return cfg
}

// consume runs consumer lifetimes until the broker is idle. It returns a
// description of why it gave up if no message was acknowledged for
// invStall, or the run passed invDeadline.
func (r *invRun) consume() (stuck string) {
	src := invSource{Broker: r.broker, r: r}
	start := time.Now()
	lastAcked, lastProgress := -1, time.Now()
	for !r.broker.Idle() {
		if r.stats.lifetimes > 0 {
			// A restarted consumer is a new session with the broker, which
			// delivers every unacknowledged message again in lane order, as
			// Kafka does from the committed offset and an SQS FIFO queue
			// does per message group.
			r.broker.Crash()
		}
		c, err := consumer.New(r.pool, src, r.config())
		if err != nil {
			r.t.Fatal(err)
		}
		if r.stats.lifetimes == 0 {
			if err := c.Migrate(context.Background()); err != nil {
				r.t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		r.mu.Lock()
		r.stats.lifetimes++
		r.lifetime++
		r.lifeBatches = 0
		r.stopLife = cancel
		r.mu.Unlock()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		tick := time.NewTicker(5 * time.Millisecond)
	watch:
		for {
			select {
			case err := <-done:
				if err != nil {
					// A kill may land in Run's preflight: start again.
					r.stats.runErrors++
					r.t.Logf("lifetime %d: Run: %v", r.lifetime, err)
				}
				break watch
			case <-tick.C:
				if a := r.broker.Stats().Acked; a != lastAcked {
					lastAcked, lastProgress = a, time.Now()
				}
				switch {
				case r.broker.Idle():
					cancel()
				case time.Since(lastProgress) > invStall:
					stuck = fmt.Sprintf("no message was acknowledged for %v (a lane is stuck)", invStall)
				case time.Since(start) > invDeadline:
					stuck = fmt.Sprintf("the run did not finish within %v", invDeadline)
				}
				if stuck != "" {
					cancel()
					select {
					case <-done:
					case <-time.After(30 * time.Second):
						stuck += "; and Run did not return within 30s of its cancellation"
						r.leaked.Store(true)
					}
					break watch
				}
			}
		}
		tick.Stop()
		cancel()
		if stuck != "" {
			break
		}
	}
	r.kills.Wait()
	r.mu.Lock()
	r.stats.broker = r.broker.Stats()
	r.stats.totals = r.hooks.Total()
	r.mu.Unlock()
	return stuck
}

func showValue(v []byte) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprintf("%q", v)
}

func quoteRef(ref string) string { return strconv.Quote(ref) }
