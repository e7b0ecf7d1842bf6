package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	clients        = 16
	startBalance   = 1_000_000
	accountsPer    = 10
	lossRate       = 0.25 // responses the client never sees
	duplicateRate  = 0.10 // payments sent as three concurrent requests at once
	declinedEvery  = 97   // every 97th payment asks for more than the account holds
	maxRetryBounce = 200 * time.Millisecond
)

var tenants = []string{"acme", "globex"}

// logical is one payment a client means to make once, whatever it takes.
type logical struct {
	tenant, key string
	body        Payment
	// first is the first response body the client saw for the key; every
	// other response it sees must be the same, byte for byte.
	mu     sync.Mutex
	first  []byte
	status int
	id     int64
}

// paymentsRun is the run's logical payments and what the clients saw.
type paymentsRun struct {
	pool     *pgxpool.Pool
	payments []*logical
	http     *http.Client

	sent, lost, replayed, conflicts atomic.Int64
}

// newRun makes n logical payments. Payment i belongs to tenant i%2 with
// key "pay-<i/2>": both tenants use the same keys, which must not meet.
func newRun(n int, pool *pgxpool.Pool) *paymentsRun {
	rng := rand.New(rand.NewPCG(7, 11))
	r := &paymentsRun{pool: pool, http: &http.Client{Timeout: 30 * time.Second}}
	for i := range n {
		from := rng.IntN(accountsPer)
		to := (from + 1 + rng.IntN(accountsPer-1)) % accountsPer
		amount := int64(1 + rng.IntN(500))
		if i%declinedEvery == declinedEvery-1 {
			amount = 10 * startBalance
		}
		r.payments = append(r.payments, &logical{
			tenant: tenants[i%len(tenants)], key: "pay-" + strconv.Itoa(i/len(tenants)),
			body: Payment{From: "a" + strconv.Itoa(from), To: "a" + strconv.Itoa(to), Amount: amount},
		})
	}
	return r
}

func (r *paymentsRun) accounts(ctx context.Context) error {
	for _, t := range tenants {
		for a := range accountsPer {
			if _, err := r.pool.Exec(ctx, `INSERT INTO pay_accounts VALUES ($1, $2, $3) ON CONFLICT (tenant, id) DO UPDATE SET balance = EXCLUDED.balance`,
				t, "a"+strconv.Itoa(a), startBalance); err != nil {
				return err
			}
		}
	}
	_, err := r.pool.Exec(ctx, `TRUNCATE pay_payments, pay_settlements`)
	return err
}

// post sends one request and returns its status and body.
func (r *paymentsRun) post(ctx context.Context, url, tenant, key string, body []byte, header map[string]string) (int, []byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer "+apiKeyOf(tenant))
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header, err
}

// attempt sends p until it gets an answer it keeps: a response lost on
// the way (lossRate) and a 409 or 503 are retried with backoff.
func (r *paymentsRun) attempt(ctx context.Context, url string, p *logical, rng *rand.Rand) error {
	body, _ := json.Marshal(p.body)
	wait := 5 * time.Millisecond
	for try := 0; ; try++ {
		r.sent.Add(1)
		status, got, h, err := r.post(ctx, url+"/v1/payments", p.tenant, p.key, body, nil)
		switch {
		case err != nil:
			return err
		case status == http.StatusConflict || status == http.StatusServiceUnavailable:
			r.conflicts.Add(1)
		case status != http.StatusCreated && status != http.StatusPaymentRequired:
			return fmt.Errorf("%s/%s: %d %s", p.tenant, p.key, status, got)
		default:
			if h.Get("Idempotent-Replayed") == "true" {
				r.replayed.Add(1)
			}
			p.mu.Lock()
			if p.first == nil {
				p.first, p.status = got, status
				var rec Receipt
				if err := json.Unmarshal(got, &rec); err != nil {
					p.mu.Unlock()
					return fmt.Errorf("%s/%s: %w", p.tenant, p.key, err)
				}
				p.id = rec.ID
			} else if status != p.status || !bytes.Equal(got, p.first) {
				p.mu.Unlock()
				return fmt.Errorf("%s/%s answered %d %q after %d %q", p.tenant, p.key, status, got, p.status, p.first)
			}
			p.mu.Unlock()
			if rng.Float64() >= lossRate {
				return nil
			}
			r.lost.Add(1) // the client never saw it: it retries
		}
		time.Sleep(wait)
		wait = min(wait*2, maxRetryBounce)
	}
}

// payAll makes every logical payment from clients goroutines, some as
// concurrent duplicates, then the two requests that must be refused.
func (r *paymentsRun) payAll(ctx context.Context, url string) error {
	if err := each(len(r.payments), clients, func(i int) error {
		p := r.payments[i]
		rng := rand.New(rand.NewPCG(uint64(i), 3))
		if rng.Float64() >= duplicateRate {
			return r.attempt(ctx, url, p, rng)
		}
		return each(3, 3, func(j int) error { return r.attempt(ctx, url, p, rand.New(rand.NewPCG(uint64(i), uint64(j)))) })
	}); err != nil {
		return err
	}
	p := r.payments[0]
	changed, _ := json.Marshal(Payment{From: p.body.From, To: p.body.To, Amount: p.body.Amount + 1})
	if status, body, _, err := r.post(ctx, url+"/v1/payments", p.tenant, p.key, changed, nil); err != nil || status != http.StatusUnprocessableEntity {
		return fmt.Errorf("a reused key with a changed amount: %d %s %v, want 422", status, body, err)
	}
	if status, body, _, err := r.post(ctx, url+"/v1/payments", p.tenant, "", changed, nil); err != nil || status != http.StatusBadRequest {
		return fmt.Errorf("a payment without a key: %d %s %v, want 400", status, body, err)
	}
	forged := map[string]string{"Authorization": "Bearer sk_forged"}
	if status, body, _, err := r.post(ctx, url+"/v1/payments", "", p.key, changed, forged); err != nil || status != http.StatusUnauthorized {
		return fmt.Errorf("a payment with an unknown API key: %d %s %v, want 401", status, body, err)
	}
	return nil
}

func (r *paymentsRun) accepted() int {
	n := 0
	for _, p := range r.payments {
		if p.status == http.StatusCreated {
			n++
		}
	}
	return n
}

// sign signs body the way the provider does (Stripe's scheme).
func sign(secret string, body []byte, at time.Time) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// settleAll delivers a settlement event for every accepted payment one to
// three times, concurrently and shuffled, the way a provider retrying
// until it gets a 2xx does; one delivery signed with a wrong secret, and
// one event for a payment that does not exist.
func (r *paymentsRun) settleAll(ctx context.Context, srv *server, secret string) error {
	type delivery struct {
		body   []byte
		secret string
		want   int
	}
	rng := rand.New(rand.NewPCG(5, 8))
	var ds []delivery
	for _, p := range r.payments {
		if p.status != http.StatusCreated {
			continue
		}
		body, _ := json.Marshal(Event{ID: "evt_" + strconv.FormatInt(p.id, 10), Type: "payment.settled", PaymentID: p.id})
		for range 1 + rng.IntN(3) {
			ds = append(ds, delivery{body: body, secret: secret, want: http.StatusOK})
		}
	}
	if len(ds) == 0 {
		return fmt.Errorf("no payment was accepted")
	}
	ds = append(ds, delivery{body: ds[0].body, secret: "whsec_wrong", want: http.StatusUnauthorized})
	poison, _ := json.Marshal(Event{ID: "evt_unknown", Type: "payment.settled", PaymentID: -1})
	ds = append(ds, delivery{body: poison, secret: secret, want: http.StatusOK})
	rng.Shuffle(len(ds), func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
	return each(len(ds), clients, func(i int) error {
		d := ds[i]
		for {
			sig := map[string]string{"Stripe-Signature": sign(d.secret, d.body, time.Now())}
			status, got, _, err := r.post(ctx, srv.url+"/webhooks/provider", "", "", d.body, sig)
			if err != nil {
				return err
			}
			if status >= 500 { // not applied: the provider delivers it again
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if status != d.want {
				return fmt.Errorf("event %s: %d %s, want %d", d.body, status, got, d.want)
			}
			return nil
		}
	})
}

// each runs f(0..n-1) on at most par goroutines and returns the first error.
func each(n, par int, f func(i int) error) error {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		once     sync.Once
	)
	for range min(par, n) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// outcomes counts the webhook consumer's outcomes.
type outcomes struct {
	mu sync.Mutex
	consumer.BatchStats
}

func (o *outcomes) BatchDone(_ context.Context, s *consumer.BatchStats) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.Applied += s.Applied
	o.Duplicate += s.Duplicate
	o.Parked += s.Parked
	o.Retried += s.Retried
}
