package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's database, broker and effect table.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	broker *consumertest.Broker
	hooks  *consumertest.Counter
}

func newEnv(t *testing.T, bcfg consumertest.Config) *env {
	t.Helper()
	pool := pgtest.NewPool(t)
	_, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		msg_id  text NOT NULL,
		lane    text NOT NULL,
		payload bytea NOT NULL
	)`) // deliberately no unique constraint: a second effect must be countable
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, broker: consumertest.New(bcfg), hooks: &consumertest.Counter{}}
}

// config fills what every test needs around the test's own choices.
func (e *env) config(cfg consumer.Config) consumer.Config {
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	if cfg.Strategy == nil {
		s, err := idset.New(idset.Config{})
		if err != nil {
			e.t.Fatal(err)
		}
		cfg.Strategy = s
	}
	if cfg.Handler == nil && cfg.BatchHandler == nil && cfg.QueueHandler == nil {
		cfg.Handler = insertEffect
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = time.Millisecond
	}
	if cfg.MaxRetryBackoff == 0 {
		cfg.MaxRetryBackoff = 5 * time.Millisecond
	}
	if cfg.GapDelay == 0 {
		cfg.GapDelay = time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = consumertest.Logger()
	}
	cfg.Hooks = append(cfg.Hooks, e.hooks)
	return cfg
}

func (e *env) consumer(cfg consumer.Config) *consumer.Consumer {
	e.t.Helper()
	return consumertest.NewConsumer(e.t, e.pool, e.broker, e.config(cfg))
}

// runUntilIdle runs c until the broker has nothing left to deliver.
func (e *env) runUntilIdle(c *consumer.Consumer, timeout time.Duration) {
	e.t.Helper()
	consumertest.RunUntilIdle(e.t, c, e.broker, timeout)
}

func insertEffect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.ID, m.Lane, m.Value)
	return err
}

func insertEffects(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids := make([]string, len(msgs))
	lanes := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	for i, m := range msgs {
		ids[i], lanes[i], payloads[i] = m.ID, m.Lane, m.Value
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, payload) SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])`, ids, lanes, payloads)
	return err
}

// effectCounts returns how many effect rows each message ID has.
func (e *env) effectCounts() map[string]int {
	e.t.Helper()
	return consumertest.EffectCounts(e.t, e.pool, "effects", "msg_id")
}

// parked returns the rows of the default parked table.
func (e *env) parked() []consumertest.ParkedRow {
	e.t.Helper()
	return consumertest.Parked(e.t, e.pool, "", "")
}

func (e *env) markerExists(scope, id string) bool {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effectively.processed WHERE scope = $1 AND id = $2`, scope, id).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n > 0
}

func msg(id string, payload string) consumer.Message {
	return consumer.Message{ID: id, Value: []byte(payload)}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// checkOnceEach checks that want distinct messages were applied, each
// once, and that the broker's duplicates reached the strategy (or the run
// did not test dedupe).
func (e *env) checkOnceEach(want int) {
	e.t.Helper()
	counts := e.effectCounts()
	if len(counts) != want {
		e.t.Errorf("%d messages applied, want %d", len(counts), want)
	}
	for id, n := range counts {
		if n != 1 {
			e.t.Errorf("%s applied %d times", id, n)
		}
	}
	if st := e.hooks.Total(); st.Duplicate == 0 {
		e.t.Error("no duplicates seen: the test did not test dedupe")
	}
}
