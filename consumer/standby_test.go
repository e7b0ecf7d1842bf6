package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// StandbyAck's settings are validated by New.
func TestStandbyAckConfig(t *testing.T) {
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ack   standby.Config
		field string
	}{
		{standby.Config{Standbys: -1}, "StandbyAck.Standbys"},
		{standby.Config{Standbys: 1, Timeout: -time.Second}, "StandbyAck.Timeout"},
		{standby.Config{Timeout: time.Second}, "StandbyAck.Standbys"},
		{standby.Config{Replayed: true}, "StandbyAck.Standbys"},
	} {
		_, err := consumer.New(pgtest.NewPool(t), consumertest.New(consumertest.Config{}),
			consumer.Config{Name: "c", Strategy: strategy, Handler: insertEffect, StandbyAck: tc.ack})
		if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want an invalid %s", tc.ack, err, tc.field)
		}
	}
	c, err := consumer.New(pgtest.NewPool(t), consumertest.New(consumertest.Config{}),
		consumer.Config{Name: "c", Strategy: strategy, Handler: insertEffect, StandbyAck: standby.Config{Standbys: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Config().StandbyAck.Timeout; got != standby.DefaultTimeout {
		t.Errorf("Timeout defaults to %s, want %s", got, standby.DefaultTimeout)
	}
}

// A role that cannot read the standbys' positions in pg_stat_replication
// (they read as NULL: the standbys would look absent) is refused at
// start-up with the grant to make; with pg_monitor granted it runs.
func TestStandbyAckNeedsPgMonitor(t *testing.T) {
	e := newEnv(t, consumertest.Config{Lanes: 2})
	ctx := context.Background()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := "standby_" + hex.EncodeToString(b)
	admin := e.pool
	cfg := consumer.Config{StandbyAck: standby.Config{Standbys: 1, Timeout: 10 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler)}
	consumertest.NewConsumer(t, admin, e.broker, e.config(cfg)) // its tables, made by the owner
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := admin.Exec(ctx, `CREATE ROLE `+ident+` LOGIN;
GRANT USAGE ON SCHEMA effectively TO `+ident+`;
GRANT ALL ON ALL TABLES IN SCHEMA effectively TO `+ident+`;
GRANT ALL ON ALL SEQUENCES IN SCHEMA effectively TO `+ident+`;
GRANT ALL ON effects TO `+ident); err != nil {
		t.Fatal(err)
	}
	pcfg := admin.Config()
	pcfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+ident+`; DROP ROLE `+ident)
	})

	e.broker.Publish(0, msg("m", "p"))
	c, err := consumer.New(pool, e.broker, e.config(cfg))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(ctx)
	if !errors.Is(err, standby.ErrPrivilege) || !strings.Contains(err.Error(), "GRANT pg_monitor TO "+ident) {
		t.Fatalf("Run: %v, want standby.ErrPrivilege naming the grant", err)
	}
	if n := e.effectCounts()["m"]; n != 0 {
		t.Fatalf("%d effects before the consumer could start, want 0", n)
	}

	if _, err := admin.Exec(ctx, `GRANT pg_monitor TO `+ident); err != nil {
		t.Fatal(err)
	}
	e.runUntilIdle(c, time.Minute)
	if n := e.effectCounts()["m"]; n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

// warnings keeps the messages logged at WARN and above.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) count(prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// With no standby to confirm a commit, a batch waits StandbyAck.Timeout,
// then is acknowledged as before: nothing is lost or applied twice, and
// every batch says so in its stats and in a WARN line. The same through
// PgBouncer in transaction pooling: the poller's query is a plain one.
func TestStandbyAckTimeoutAcknowledgesUnconfirmed(t *testing.T) {
	for _, bouncer := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "pgbouncer"}[bouncer], func(t *testing.T) {
			bcfg := consumertest.Config{Lanes: 3}
			var e *env
			if bouncer {
				e = bouncerEnv(t, pgx.QueryExecModeExec, bcfg)
			} else {
				e = newEnv(t, bcfg)
			}
			for i := range 30 {
				e.broker.Publish(i, msg(fmt.Sprintf("m-%d", i), "p"))
			}
			w := &warnings{}
			c := e.consumer(consumer.Config{BatchSize: 5, Logger: slog.New(w),
				StandbyAck: standby.Config{Standbys: 1, Timeout: 20 * time.Millisecond}})
			e.runUntilIdle(c, time.Minute)
			if got := e.effectCounts(); len(got) != 30 || rowsOf(got) != 30 {
				t.Fatalf("effects %v, want one of each of 30", got)
			}
			batches := e.hooks.Batches()
			for _, st := range batches {
				if !st.StandbyUnconfirmed || st.Standby < 20*time.Millisecond || st.Err != nil {
					t.Errorf("batch %d: StandbyUnconfirmed %v after %s, err %v; want unconfirmed after at least 20ms, no error", st.Batch, st.StandbyUnconfirmed, st.Standby, st.Err)
				}
			}
			if n := w.count("StandbyAck requires 1 standbys and the primary has 0 streaming"); n != 1 {
				t.Errorf("start-up warning logged %d times, want 1", n)
			}
			if n := w.count("batch acknowledged although 0 of the 1 standbys required confirmed its commit"); n != len(batches) {
				t.Errorf("%d warnings of an unconfirmed acknowledgement for %d batches", n, len(batches))
			}
		})
	}
}

func rowsOf(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// With an asynchronous standby and StandbyAck: standby.Config{Replayed: true}, every batch
// is acknowledged only once the standby has replayed its commit: when a
// batch's BatchDone runs, the standby shows every effect acknowledged so
// far, and no batch is acknowledged unconfirmed.
func TestStandbyAckWaitsForTheStandby(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := pgtest.StartReplicated(ctx, pgtest.ReplicaOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	})
	dsn, err := r.CreateDatabase(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, payload bytea NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	scfg, err := pgx.ParseConfig(r.Standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	scfg.Database = "app"
	replica, err := pgx.ConnectConfig(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close(context.Background())

	const n = 400
	b := consumertest.New(consumertest.Config{Lanes: 4})
	for i := range n {
		b.Publish(i, msg(fmt.Sprintf("m-%d", i), "p"))
	}
	check := &replicaCheck{conn: replica}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := consumertest.NewConsumer(t, pool, b, consumer.Config{
		Name: "standby", Strategy: strategy, Handler: insertEffect, BatchSize: 10,
		StandbyAck: standby.Config{Standbys: 1, Replayed: true, Timeout: time.Minute},
		Hooks:      []consumer.Hook{check}, Logger: consumertest.Logger(),
	})
	consumertest.RunUntilIdle(t, c, b, time.Minute)
	check.mu.Lock()
	defer check.mu.Unlock()
	for _, f := range check.failures {
		t.Error(f)
	}
	if check.applied != n {
		t.Errorf("%d applied, want %d", check.applied, n)
	}
}

// replicaCheck is a hook that counts, at each BatchDone, the effects the
// standby shows, and records a failure when they are fewer than the
// messages acknowledged so far.
type replicaCheck struct {
	mu       sync.Mutex
	conn     *pgx.Conn
	applied  int
	failures []string
}

func (h *replicaCheck) BatchDone(ctx context.Context, st *consumer.BatchStats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.applied += st.Applied
	if st.StandbyUnconfirmed || st.Err != nil {
		h.failures = append(h.failures, fmt.Sprintf("batch %d: unconfirmed %v, err %v", st.Batch, st.StandbyUnconfirmed, st.Err))
	}
	var onStandby int
	if err := h.conn.QueryRow(context.WithoutCancel(ctx), `SELECT count(*) FROM effects`).Scan(&onStandby); err != nil {
		h.failures = append(h.failures, err.Error())
		return
	}
	if onStandby < h.applied {
		h.failures = append(h.failures, fmt.Sprintf("after batch %d: %d messages acknowledged, %d effects on the standby", st.Batch, h.applied, onStandby))
	}
}
