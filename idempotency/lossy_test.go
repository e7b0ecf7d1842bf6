package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pgtest"
)

// lossyRequests is the number of logical requests of TestLossyClient:
// IDEMPOTENCY_LOSSY_REQUESTS, else 10,000, or 1,000 with -short.
func lossyRequests(t *testing.T) int {
	if v := os.Getenv("IDEMPOTENCY_LOSSY_REQUESTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("IDEMPOTENCY_LOSSY_REQUESTS=%q: want a positive number", v)
		}
		return n
	}
	if testing.Short() {
		return 1000
	}
	return 10000
}

// TestLossyClient sends logical requests (one key and one payment each)
// through a client that loses responses: it closes the connection right
// after sending, or a moment later, and retries with backoff; it sends
// concurrent duplicates; it re-serializes the JSON body differently on each
// attempt. The invariant: exactly one payment row per logical request, and
// every 201 a client got for a key is byte for byte the first one (the
// body holds the row's server-generated ID).
func TestLossyClient(t *testing.T) {
	t.Parallel()
	n := lossyRequests(t)
	const workers = 16
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = workers
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := newEnvPool(t, pool, idempotency.Config{SingleTenant: true}, nil)
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * workers}}
	defer client.CloseIdleConnections()

	c := &lossyClient{t: t, addr: addr, url: e.srv.URL + "/payments", client: client}
	got := make([][]byte, n) // the first 201 body of each logical request
	var stats lossyStats
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for i := range jobs {
				got[i] = c.logical(rng, i, &stats)
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%d logical requests: %s", n, stats.String())

	rows, err := pool.Query(context.Background(), `SELECT key, count(*), min(id) FROM payments GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int64{}
	for rows.Next() {
		var key string
		var count, id int64
		if err := rows.Scan(&key, &count, &id); err != nil {
			t.Fatal(err)
		}
		if count != 1 {
			t.Errorf("key %s: %d payments, want 1", key, count)
		}
		seen[key] = id
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Errorf("%d keys have payments, want %d", len(seen), n)
	}
	for i, b := range got {
		var r struct{ ID int64 }
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("request %d: body %s: %v", i, b, err)
		}
		if id := seen[lossyKey(i)]; r.ID != id {
			t.Errorf("request %d answered payment %d, the table holds %d", i, r.ID, id)
		}
	}
}

func lossyKey(i int) string { return fmt.Sprintf("lossy-%d", i) }

type lossyStats struct {
	mu                                       sync.Mutex
	attempts, dropped, raced, conflict, busy int
}

func (s *lossyStats) add(f func(*lossyStats)) { s.mu.Lock(); f(s); s.mu.Unlock() }

func (s *lossyStats) String() string {
	return fmt.Sprintf("%d attempts, %d responses dropped, %d races of concurrent duplicates, %d answered 409, %d answered 503",
		s.attempts, s.dropped, s.raced, s.conflict, s.busy)
}

type lossyClient struct {
	t      *testing.T
	addr   string
	url    string
	client *http.Client
}

// body returns the payment of request i, serialized in one of several
// ways that all mean the same.
func lossyBody(rng *rand.Rand, i int) string {
	to := fmt.Sprintf("acct_%d", i%97)
	switch rng.IntN(3) {
	case 0:
		return fmt.Sprintf(`{"amount":%d,"to":%q}`, i, to)
	case 1:
		return fmt.Sprintf(`{ "to": %q, "amount": %d }`, to, i)
	default:
		return fmt.Sprintf("{\n  \"amount\" : %d ,\n  \"to\" : %q\n}\n", i, to)
	}
}

// logical runs request i to completion and returns the body of the first
// 201 it got, failing the test if a later 201 differs.
func (c *lossyClient) logical(rng *rand.Rand, i int, st *lossyStats) []byte {
	key := lossyKey(i)
	var first []byte
	var mu sync.Mutex
	check := func(r reply) bool {
		st.add(func(s *lossyStats) {
			s.attempts++
			switch r.status {
			case http.StatusConflict:
				s.conflict++
			case http.StatusServiceUnavailable:
				s.busy++
			}
		})
		switch r.status {
		case http.StatusCreated:
		case http.StatusConflict, http.StatusServiceUnavailable:
			return false
		default:
			c.t.Errorf("request %d: status %d: %s", i, r.status, r.body)
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = r.body
		} else if !bytes.Equal(first, r.body) {
			c.t.Errorf("request %d: 201 with %s, earlier %s", i, r.body, first)
		}
		return true
	}
	done := false
	backoff := time.Millisecond
	for !done && !c.t.Failed() {
		switch p := rng.IntN(10); {
		case p < 4: // the response is lost: the connection closes after sending
			c.drop(key, lossyBody(rng, i), time.Duration(rng.IntN(3000))*time.Microsecond)
			st.add(func(s *lossyStats) { s.dropped++ })
		case p < 6: // concurrent duplicates
			k := 2 + rng.IntN(2)
			bodies := make([]string, k)
			for j := range bodies {
				bodies[j] = lossyBody(rng, i)
			}
			var wg sync.WaitGroup
			var ok bool
			for _, b := range bodies {
				wg.Go(func() {
					if r, err := c.post(key, b); err == nil && check(r) {
						mu.Lock()
						ok = true
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			st.add(func(s *lossyStats) { s.raced++ })
			done = ok
		default:
			r, err := c.post(key, lossyBody(rng, i))
			done = err == nil && check(r)
		}
		if !done {
			time.Sleep(backoff + time.Duration(rng.IntN(int(backoff)))) // the client's backoff, with jitter
			backoff = min(2*backoff, 50*time.Millisecond)
		}
	}
	if rng.IntN(4) == 0 { // a late retry, after the answer
		if r, err := c.post(key, lossyBody(rng, i)); err == nil {
			check(r)
		}
	}
	return first
}

func (c *lossyClient) post(key, body string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, c.url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// drop sends the request on a connection of its own and closes it after
// wait, without reading the response.
func (c *lossyClient) drop(key, body string, wait time.Duration) {
	conn, err := net.Dial("tcp", c.addr)
	if err != nil {
		c.t.Errorf("dial: %v", err)
		return
	}
	defer conn.Close()
	u, _ := url.Parse(c.url)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s",
		u.Path, u.Host, key, len(body), body)
	if wait > 0 {
		time.Sleep(wait) // the client's timeout
	}
}
