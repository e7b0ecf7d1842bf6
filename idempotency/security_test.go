package idempotency_test

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// TestScopeRequired: a Config that does not say whose a key is (no Scope,
// no SingleTenant) is refused, as is one that says both.
func TestScopeRequired(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	scope := func(*http.Request) (string, error) { return "a", nil }
	for _, c := range []struct {
		name  string
		cfg   idempotency.Config
		field string
	}{
		{"neither", idempotency.Config{}, "Scope"},
		{"both", idempotency.Config{Scope: scope, SingleTenant: true}, "SingleTenant"},
	} {
		_, err := idempotency.New(pool, c.cfg)
		var ce *pg.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, pg.ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: New returned %v, want a ConfigError naming %s", c.name, err, c.field)
		}
	}
}

// TestCredentialHeadersRefused: a response header that carries a caller's
// credentials cannot be stored for replay.
func TestCredentialHeadersRefused(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	for _, h := range []string{"Set-Cookie", "set-cookie", "Authorization", "Proxy-Authorization", "Cookie", "WWW-Authenticate", "Proxy-Authenticate", "Authentication-Info"} {
		_, err := idempotency.New(pool, idempotency.Config{SingleTenant: true, Headers: []string{"X-Request-Id", h}})
		if !errors.Is(err, pg.ErrInvalidConfig) || !strings.Contains(err.Error(), "credentials") {
			t.Errorf("Headers %q: New returned %v, want a ConfigError about credentials", h, err)
		}
	}
	if _, err := idempotency.New(pool, idempotency.Config{SingleTenant: true, Headers: []string{"X-Request-Id"}}); err != nil {
		t.Fatalf("a plain header refused: %v", err)
	}
}

// TestSecondPrincipal: with the scope taken from the authenticated
// principal (a bearer token), a second caller who sends the first one's
// key and body runs his own request: he never receives the first one's
// response, and the first one's key does not lock him out (no 422).
func TestSecondPrincipal(t *testing.T) {
	t.Parallel()
	tokens := map[string]string{"tok_alice": "acct_alice", "tok_bob": "acct_bob"}
	e := newEnv(t, idempotency.Config{Scope: func(r *http.Request) (string, error) {
		acct, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			return "", errors.New("unknown bearer token")
		}
		return acct, nil
	}}, nil)
	body := `{"amount":5,"to":"x"}`
	alice := e.post(t, "shared-key", body, "Authorization", "Bearer tok_alice")
	wantStatus(t, alice, http.StatusCreated)
	bob := e.post(t, "shared-key", body, "Authorization", "Bearer tok_bob")
	wantStatus(t, bob, http.StatusCreated)
	if bob.header.Get(idempotency.ReplayedHeader) != "" || bytes.Equal(bob.body, alice.body) {
		t.Fatalf("the second principal got the first one's response: %s (replayed %q)", bob.body, bob.header.Get(idempotency.ReplayedHeader))
	}
	// A key squatter: another principal used the key first with another body.
	wantStatus(t, e.post(t, "squatted", `{"amount":1,"to":"y"}`, "Authorization", "Bearer tok_bob"), http.StatusCreated)
	wantStatus(t, e.post(t, "squatted", body, "Authorization", "Bearer tok_alice"), http.StatusCreated)
	// Unauthenticated: no scope, nothing runs.
	wantStatus(t, e.post(t, "shared-key", body, "Authorization", "Bearer forged"), http.StatusBadRequest)
	if n := e.count(t, "key = 'shared-key'"); n != 2 {
		t.Fatalf("%d payments for the shared key, want 2 (one per principal)", n)
	}
}

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestKeyNotLogged: an error logged about a request names its key by a
// short hash, never in clear: a key is a bearer of its stored response.
func TestKeyNotLogged(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	e := newEnv(t, idempotency.Config{SingleTenant: true, MaxResponseBytes: 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil)
	const key = "secret-key-4f9c2d"
	wantStatus(t, e.post(t, key, `{"amount":5,"to":"x"}`), http.StatusInternalServerError) // response over the limit: logged at error level
	out := logs.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "key_hash=") {
		t.Fatalf("no error line with a key hash logged: %s", out)
	}
	if strings.Contains(out, key) {
		t.Fatalf("the key is logged in clear: %s", out)
	}
}
