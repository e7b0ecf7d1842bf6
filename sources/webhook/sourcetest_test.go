package webhook_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/sourcetest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5/pgxpool"
)

// providerRetry is how soon the simulated provider delivers again after a
// failure that says nothing of when (a 503 without Retry-After, a refused
// connection).
const providerRetry = 50 * time.Millisecond

// provider is a webhook provider as the conformance suite's broker: it
// holds every published message and POSTs it to the current receiver
// until it is answered 2xx, again after a 5xx (honouring Retry-After) or
// a failed connection, as Stripe, GitHub and Standard Webhooks senders
// do.
type provider struct {
	ctx    context.Context
	client *http.Client
	wg     sync.WaitGroup

	mu   sync.Mutex
	url  string
	srvs []*httptest.Server
}

func newProvider(t *testing.T) *provider {
	ctx, cancel := context.WithCancel(context.Background())
	p := &provider{ctx: ctx, client: &http.Client{}}
	t.Cleanup(func() {
		cancel()
		p.wg.Wait()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, s := range p.srvs {
			// Not Close, which waits for every request: a batch the suite
			// fetched and never settled (a test that failed) holds its
			// requests for good.
			s.Listener.Close()
			s.CloseClientConnections()
		}
	})
	return p
}

// receive makes srv the receiver of every later delivery.
func (p *provider) receive(srv *httptest.Server) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.url = srv.URL
	p.srvs = append(p.srvs, srv)
}

// send delivers m until it is accepted.
func (p *provider) send(m sourcetest.Message) {
	p.wg.Go(func() {
		for {
			wait, done := p.post(m)
			if done {
				return
			}
			select {
			case <-time.After(wait):
			case <-p.ctx.Done():
				return
			}
		}
	})
}

// post makes one delivery: done when it was accepted, else when to try
// again.
func (p *provider) post(m sourcetest.Message) (wait time.Duration, done bool) {
	p.mu.Lock()
	url := p.url
	p.mu.Unlock()
	req, err := http.NewRequestWithContext(p.ctx, http.MethodPost, url+"/hooks", bytes.NewReader(m.Value))
	if err != nil {
		return providerRetry, false
	}
	for _, h := range m.Headers {
		req.Header.Add(h.Key, string(h.Value))
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return providerRetry, false
	}
	resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return 0, true
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		return time.Duration(s) * time.Second, false
	}
	return providerRetry, false
}

// TestSourceConformance runs the source conformance suite with a simulated
// provider as the broker, the event ID in a header and the attempt counts
// in Postgres. Two features say where webhooks differ from a queue:
//
//   - Unordered: providers promise no order, and the source spreads events
//     over lanes by a hash of their ID;
//   - Duplicates: providers deliver an event more than once on their own
//     (Stripe's and GitHub's documentation say so), and the source counts
//     no attempt for a delivery the consumer abandoned at shutdown (the
//     provider's redelivery comes with the same Attempt), a deliberate
//     difference from the Source contract (see TestShutdownMidBatch) that
//     only this feature lets pass.
func TestSourceConformance(t *testing.T) {
	t.Parallel()
	tagKey := http.CanonicalHeaderKey(sourcetest.TagHeader)
	sourcetest.Run(t, sourcetest.Harness{
		Lanes:           1,
		RedeliveryDelay: 500 * time.Millisecond,
		Features:        sourcetest.Features{Unordered: true, Duplicates: true, BinaryValues: true},
		New: func(t *testing.T) *sourcetest.Broker {
			pool, err := pgxpool.New(context.Background(), pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			// What the consumer's Migrate does before it runs.
			if _, err := pg.Migrate(context.Background(), pool, "", webhook.AttemptsLine("", "")); err != nil {
				t.Fatal(err)
			}
			p := newProvider(t)
			return &sourcetest.Broker{
				Publish: func(_ *testing.T, _ int, msgs ...sourcetest.Message) {
					for _, m := range msgs {
						p.send(m)
					}
				},
				Open: func(t *testing.T) consumer.Source {
					src, err := webhook.New(webhook.Config{
						Verifier: webhook.Unverified(),
						ID:       webhook.Header(sourcetest.TagHeader),
						Headers:  []string{sourcetest.TagHeader},
						// HTTP header names are case-insensitive and kept in
						// their canonical form; the suite looks for its own.
						Redact: func(m *consumer.Message) {
							for i := range m.Headers {
								if m.Headers[i].Key == tagKey {
									m.Headers[i].Key = sourcetest.TagHeader
								}
							}
						},
						DB:     pool,
						Logger: testLogger(),
					})
					if err != nil {
						t.Fatal(err)
					}
					p.receive(httptest.NewServer(src))
					return src
				},
				DB: pool,
			}
		},
	})
}
