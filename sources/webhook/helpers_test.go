package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestMain stops the throwaway PostgreSQL server at the end.
func TestMain(m *testing.M) { pgtest.Main(m) }

const testSecret = "whsec_effectively_test"

// env is one test's database, webhook source behind a real HTTP server on
// loopback, and consumer.
type env struct {
	t     *testing.T
	pool  *pgxpool.Pool
	src   *webhook.Source
	srv   *httptest.Server
	hooks *consumertest.Counter
	cons  *consumer.Consumer
	run   *consumertest.Running

	mu       sync.Mutex
	observed []webhook.Delivery
	watch    func(webhook.Delivery)
}

// newEnv makes the source (Stripe-style signatures with testSecret and the
// event ID from the body's "id", unless wcfg has a Verifier) and a migrated
// consumer on it (idset, a handler that inserts one effect row per event,
// quick retries unless ccfg says otherwise), and serves the source. The
// consumer is not started: see start.
func newEnv(t *testing.T, wcfg webhook.Config, ccfg consumer.Config) *env {
	t.Helper()
	return newEnvWith(t, wcfg, ccfg, nil)
}

// newEnvWith is newEnv with the pool's configuration changed by configure
// (its dialer, say), when configure is not nil.
func newEnvWith(t *testing.T, wcfg webhook.Config, ccfg consumer.Config, configure func(*pgxpool.Config)) *env {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 12 // the consumer's batches and the test's checks
	if configure != nil {
		configure(pcfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Deliberately no unique constraint on event_id: a second effect must
	// be countable.
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		n        bigserial PRIMARY KEY,
		event_id text NOT NULL,
		attempt  int NOT NULL,
		payload  bytea NOT NULL
	)`); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, pool: pool, hooks: &consumertest.Counter{}}

	if wcfg.Verifier == nil {
		v, err := webhook.NewStripeVerifier(webhook.StripeConfig{Secrets: []string{testSecret}})
		if err != nil {
			t.Fatal(err)
		}
		wcfg.Verifier = v
		if wcfg.ID == nil {
			wcfg.ID = webhook.JSONField("id")
		}
	}
	if wcfg.Logger == nil {
		wcfg.Logger = testLogger()
	}
	wcfg.Observe = func(d webhook.Delivery) {
		e.mu.Lock()
		e.observed = append(e.observed, d)
		w := e.watch
		e.mu.Unlock()
		if w != nil {
			w(d)
		}
	}
	src, err := webhook.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	e.src = src
	t.Cleanup(func() { _ = src.Close() })

	if ccfg.Name == "" {
		ccfg.Name = "hooks"
	}
	if ccfg.Strategy == nil {
		s, err := idset.New(idset.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ccfg.Strategy = s
	}
	if ccfg.Handler == nil && ccfg.BatchHandler == nil && ccfg.QueueHandler == nil {
		ccfg.Handler = insertEffect
	}
	if ccfg.RetryBackoff == 0 {
		ccfg.RetryBackoff = time.Millisecond
	}
	if ccfg.MaxRetryBackoff == 0 {
		ccfg.MaxRetryBackoff = time.Millisecond
	}
	if ccfg.Logger == nil {
		ccfg.Logger = testLogger()
	}
	ccfg.Hooks = append(ccfg.Hooks, e.hooks)
	e.cons = consumertest.NewConsumer(t, pool, src, ccfg)

	e.srv = httptest.NewServer(src)
	// Cleanups run last first: the server closes, then the consumer stops,
	// then the source closes.
	t.Cleanup(func() {
		e.srv.Close()
		if e.run != nil {
			e.run.Stop(t)
		}
	})
	return e
}

// testLogger is consumertest's debug logger with TEST_LOG set, and a
// silent one otherwise (the tests make rejections on purpose).
func testLogger() *slog.Logger {
	if l := consumertest.Logger(); l != nil {
		return l
	}
	return slog.New(slog.DiscardHandler)
}

// start runs the consumer and waits until it fetches from the source.
func (e *env) start() {
	e.t.Helper()
	e.run = consumertest.Start(e.cons)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.src.WaitRunning(ctx); err != nil {
		e.t.Fatalf("WaitRunning: %v", err)
	}
}

// stop stops the consumer.
func (e *env) stop() {
	e.t.Helper()
	e.run.Stop(e.t)
	e.run = nil
}

func insertEffect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, attempt, payload) VALUES ($1, $2, $3)`, m.DedupeKey.ID, m.Attempt, m.Value)
	return err
}

// stripeSign returns a Stripe-Signature header for body signed at ts with
// secret, computed here rather than by the package.
func stripeSign(secret string, ts time.Time, body []byte) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(t + "."))
	m.Write(body)
	return "t=" + t + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// event returns the body of event id.
func event(id string, amount int) []byte {
	return fmt.Appendf(nil, `{"id":%q,"type":"payment_intent.succeeded","data":{"amount":%d}}`, id, amount)
}

// reply is an answer the test's client got.
type reply struct {
	status int
	body   string
	header http.Header
}

// post delivers body signed now, as a provider does.
func (e *env) post(body []byte) reply {
	return e.postSigned(body, stripeSign(testSecret, time.Now(), body))
}

// postSigned delivers body with the given Stripe-Signature header (none
// when empty).
func (e *env) postSigned(body []byte, sig string) reply {
	return e.do(context.Background(), http.MethodPost, body, sig)
}

func (e *env) do(ctx context.Context, method string, body []byte, sig string) reply {
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+"/hooks/stripe", strings.NewReader(string(body)))
	if err != nil {
		e.t.Error(err)
		return reply{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer kept-out-of-the-parked-table")
	if sig != "" {
		req.Header.Set("Stripe-Signature", sig)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		if ctx.Err() == nil {
			e.t.Errorf("POST: %v", err)
		}
		return reply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, body: string(b), header: resp.Header}
}

// effects returns how many effect rows event id has.
func (e *env) effects(id string) int {
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE event_id = $1`, id).Scan(&n); err != nil {
		e.t.Error(err)
	}
	return n
}

// effectCounts returns the number of effect rows of every event.
func (e *env) effectCounts() map[string]int {
	return consumertest.EffectCounts(e.t, e.pool, "effects", "event_id")
}

// parked returns the parked rows.
func (e *env) parked() []consumertest.ParkedRow {
	return consumertest.Parked(e.t, e.pool, "", "")
}

// results returns the Observe results of every request so far, by result.
func (e *env) results() map[webhook.Result]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[webhook.Result]int{}
	for _, d := range e.observed {
		out[d.Result]++
	}
	return out
}

// expectStatus fails unless r has status want.
func expectStatus(t *testing.T, what string, r reply, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: answered %d %q, want %d", what, r.status, r.body, want)
	}
}

func bytesReader(b []byte) *strings.Reader { return strings.NewReader(string(b)) }
