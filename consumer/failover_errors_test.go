package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// What a consumer meets while its primary is switched: connections
// refused, a server that has become read-only, one starting up, sessions
// ended under it, an unknown COMMIT outcome. Each is retried with backoff
// and reported, never counted as a handler failure and never parks a
// message: every test runs with MaxAttempts 1, so a single counted failure
// would park its message.

// switchEnv is a test database whose sessions the test can end, and whose
// connections it can refuse, as a primary switch does.
type switchEnv struct {
	*env
	db    string
	admin *pgx.Conn // on the server's "postgres" database
	rec   *recorder
}

func newSwitchEnv(t *testing.T, pool func(*pgxpool.Config)) *switchEnv {
	e := newEnv(t, consumertest.Config{Lanes: 1})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.Server(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	se := &switchEnv{env: e, db: e.pool.Config().ConnConfig.Database, admin: admin, rec: newRecorder()}
	if pool != nil {
		e.withRoleSettings(nil, pool)
	}
	return se
}

func (se *switchEnv) exec(sql string) {
	se.t.Helper()
	if _, err := se.admin.Exec(context.Background(), sql); err != nil {
		se.t.Fatalf("%s: %v", sql, err)
	}
}

// endSessions ends every session of the database, as a primary that goes
// away does.
func (se *switchEnv) endSessions() {
	se.t.Helper()
	_, err := se.admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, se.db)
	if err != nil {
		se.t.Fatal(err)
	}
}

// start runs a consumer, and returns once a first message has applied.
func (se *switchEnv) start(cfg consumer.Config) *consumertest.Running {
	se.t.Helper()
	cfg.MaxAttempts = 1
	cfg.Hooks = append(cfg.Hooks, se.rec)
	se.broker.Publish(0, msg("before", "p"))
	r := consumertest.Start(se.consumer(cfg))
	se.rec.waitUntil(se.t, time.Minute, "the first message to apply", func() bool {
		return se.rec.messageEvents("before", func(ev consumer.MessageEvent) bool { return ev.Outcome == consumer.OutcomeApplied }) > 0
	})
	return r
}

// finish waits for the broker to settle everything, stops the consumer
// and checks that every message applied once and none was parked.
func (se *switchEnv) finish(r *consumertest.Running, ids ...string) {
	se.t.Helper()
	werr := se.broker.WaitIdle(ctxTimeout(se.t, time.Minute))
	r.Stop(se.t)
	if werr != nil {
		se.t.Fatal(werr)
	}
	counts := se.effectCounts()
	for _, id := range append(ids, "before") {
		if counts[id] != 1 {
			se.t.Errorf("%s has %d effects, want 1", id, counts[id])
		}
	}
	if p := se.parked(); len(p) != 0 {
		se.t.Errorf("parked %v, want none", p)
	}
}

func hasCode(code string) func(error) bool {
	return func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == code
	}
}

// A primary made read-only (default_transaction_read_only, as a standby
// is): every batch fails with SQLSTATE 25006, is rolled back and delivered
// again after a backoff, and applies once the database takes writes again.
func TestReadOnlyDatabaseIsRetried(t *testing.T) {
	se := newSwitchEnv(t, nil)
	r := se.start(consumer.Config{})
	se.exec("ALTER DATABASE " + pgx.Identifier{se.db}.Sanitize() + " SET default_transaction_read_only = on")
	se.endSessions()
	ids := []string{"m1", "m2", "m3"}
	for _, id := range ids {
		se.broker.Publish(0, msg(id, "p"))
	}
	se.rec.waitUntil(t, time.Minute, "three batches refused as read-only", func() bool { return se.rec.batchErrs(hasCode("25006")) >= 3 })
	se.exec("ALTER DATABASE " + pgx.Identifier{se.db}.Sanitize() + " RESET default_transaction_read_only")
	se.endSessions()
	se.finish(r, ids...)
}

// refusingDialer dials the server, or, while down, a closed port: the
// connection is refused, as by a primary that is gone.
type refusingDialer struct {
	down   atomic.Bool
	closed string // address of a closed port
}

func (d *refusingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.down.Load() {
		return (&net.Dialer{}).DialContext(ctx, "tcp", d.closed)
	}
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// Connections refused while the primary is away: the batches fail at
// BEGIN, are delivered again after a backoff, and apply once it is back.
func TestConnectionRefusedIsRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &refusingDialer{closed: l.Addr().String()}
	l.Close()
	se := newSwitchEnv(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.DialFunc = d.dial })
	r := se.start(consumer.Config{})
	d.down.Store(true)
	se.endSessions()
	ids := []string{"m1", "m2", "m3"}
	for _, id := range ids {
		se.broker.Publish(0, msg(id, "p"))
	}
	se.rec.waitUntil(t, time.Minute, "three batches failing to connect", func() bool {
		return se.rec.batchErrs(func(err error) bool { return strings.Contains(err.Error(), "connection refused") }) >= 3
	})
	d.down.Store(false)
	se.finish(r, ids...)
}

// The server ends the session during COMMIT, three times running: each
// time the consumer finds out that the batch did not commit (nothing is
// reported unknown), the messages are delivered again without an attempt
// counted, and the redelivery applies them once.
func TestUnknownCommitOutcomeIsNotCounted(t *testing.T) {
	se := newSwitchEnv(t, nil)
	if _, err := se.pool.Exec(context.Background(), `
CREATE SEQUENCE kills;
CREATE FUNCTION kill_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.msg_id = 'm1' AND nextval('kills') <= 3 THEN
		PERFORM pg_terminate_backend(pg_backend_pid());
		PERFORM pg_sleep(1); -- the termination interrupts this
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER kill_at_commit AFTER INSERT ON effects
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION kill_at_commit()`); err != nil {
		t.Fatal(err)
	}
	r := se.start(consumer.Config{})
	se.broker.Publish(0, msg("m1", "p"))
	se.broker.Publish(0, msg("m2", "p"))
	se.finish(r, "m1", "m2")
	if n := se.rec.messageEvents("m1", func(ev consumer.MessageEvent) bool { return ev.Outcome == consumer.OutcomeUnknown }); n != 0 {
		t.Errorf("m1 was reported unknown %d times, want 0: the consumer can find out", n)
	}
	if n := se.rec.batchErrs(func(err error) bool { return strings.Contains(err.Error(), "did not commit") }); n != 3 {
		t.Errorf("%d batches found not committed after their COMMIT lost its reply, want 3", n)
	}
}

// The errors of a switch as a handler's statement meets them (the server
// cannot lose its primary on cue, so the handler returns the server's
// error as pgx reports it): those that say the database cannot take the
// batch abandon it with an *UnavailableError; a lock, serialization or
// deadlock failure retries the message alone with a *TransientError. None
// counts as an attempt.
func TestSwitchErrorsFromAHandlerAreNotCounted(t *testing.T) {
	for _, tc := range []struct {
		err         *pgconn.PgError
		unavailable bool
	}{
		{&pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"}, true},
		{&pgconn.PgError{Severity: "ERROR", Code: "25006", Message: "cannot execute INSERT in a read-only transaction"}, true},
		{&pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{&pgconn.PgError{Severity: "FATAL", Code: "08006", Message: "connection failure"}, true},
		{&pgconn.PgError{Severity: "ERROR", Code: "53300", Message: "sorry, too many clients already"}, true},
		{&pgconn.PgError{Severity: "ERROR", Code: "55P03", Message: "canceling statement due to lock timeout"}, false},
		{&pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "could not serialize access due to concurrent update"}, false},
		{&pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected"}, false},
	} {
		t.Run(tc.err.Code, func(t *testing.T) {
			se := newSwitchEnv(t, nil)
			var mu sync.Mutex
			failures := 0
			h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				mu.Lock()
				fail := m.ID == "m" && failures < 3
				if fail {
					failures++
				}
				mu.Unlock()
				if fail {
					return fmt.Errorf("handler: %w", tc.err)
				}
				return insertEffect(ctx, tx, m)
			}
			r := se.start(consumer.Config{Handler: h})
			se.broker.Publish(0, msg("m", "p"))
			se.broker.Publish(0, msg("n", "p"))
			se.finish(r, "m", "n")
			unavailable := se.rec.batchErrs(func(err error) bool {
				var ue *consumer.UnavailableError
				return errors.As(err, &ue) && hasCode(tc.err.Code)(err)
			})
			transient := se.rec.messageEvents("m", func(ev consumer.MessageEvent) bool {
				return ev.Outcome == consumer.OutcomeRetried && consumer.IsTransient(ev.Err) && hasCode(tc.err.Code)(ev.Err)
			})
			if tc.unavailable && unavailable != 3 {
				t.Errorf("%d batches abandoned with an UnavailableError, want 3", unavailable)
			}
			if !tc.unavailable && transient != 3 {
				t.Errorf("%d retries of m with a TransientError, want 3", transient)
			}
		})
	}
}
