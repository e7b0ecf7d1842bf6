package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A Stripe endpoint: each event is applied once, in the same transaction
// as its dedupe marker, and Stripe gets its 200 only after the commit.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	verifier, err := webhook.NewStripeVerifier(webhook.StripeConfig{
		Secrets: []string{os.Getenv("STRIPE_WEBHOOK_SECRET")},
	})
	if err != nil {
		log.Fatal(err)
	}
	src, err := webhook.New(webhook.Config{
		Verifier: verifier,
		ID:       webhook.JSONField("id"), // Stripe's event ID, the same in every retry
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close() // last: after the server and the consumer

	pool, err := pgxpool.New(ctx, "postgres:///payments")
	if err != nil {
		log.Fatal(err)
	}
	strategy, err := idset.New(idset.Config{Retention: 30 * 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(pool, src, consumer.Config{
		Name:     "stripe-events",
		Strategy: strategy,
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO stripe_events (id, body) VALUES ($1, $2)`, m.ID, m.Value)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	running := make(chan error, 1)
	go func() { running <- c.Run(context.WithoutCancel(ctx)) }()

	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", src)
	srv := &http.Server{Addr: ":8080", Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown) // waits for the requests whose batches are in flight
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
	// Then stop the consumer: closing the source makes Run return once its
	// batches have settled.
	_ = src.Close()
	if err := <-running; err != nil {
		log.Fatal(err)
	}
}

// A GitHub-style signature checked by hand, with the vector from GitHub's
// documentation.
func ExampleGitHubVerifier() {
	v, err := webhook.NewGitHubVerifier(webhook.GitHubConfig{Secrets: []string{"It's a Secret to Everybody"}})
	if err != nil {
		log.Fatal(err)
	}
	body := "Hello, World!"
	r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
	r.Header.Set("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
	fmt.Println(v.Verify(r, []byte(body)))
	fmt.Println(errors.Is(v.Verify(r, []byte(body+"!")), webhook.ErrSignatureMismatch))
	// Output:
	// <nil>
	// true
}

// A Stripe-style signature: t=<unix time>,v1=<HMAC-SHA256 of "t.body">.
// Signatures older than the tolerance (5 minutes) are refused as stale.
func ExampleStripeVerifier() {
	secret, body := "whsec_example", []byte(`{"id":"evt_1"}`)
	signedAt := time.Unix(1700000000, 0)
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "%d.%s", signedAt.Unix(), body)
	header := fmt.Sprintf("t=%d,v1=%s", signedAt.Unix(), hex.EncodeToString(mac.Sum(nil)))

	for _, now := range []time.Time{signedAt.Add(time.Minute), signedAt.Add(time.Hour)} {
		v, err := webhook.NewStripeVerifier(webhook.StripeConfig{Secrets: []string{secret}, Now: func() time.Time { return now }})
		if err != nil {
			log.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(string(body)))
		r.Header.Set("Stripe-Signature", header)
		err = v.Verify(r, body)
		fmt.Println(err == nil, errors.Is(err, webhook.ErrStaleSignature))
	}
	// Output:
	// true false
	// false true
}

// A Standard Webhooks signature (Svix, Clerk, Resend …), with the vector
// of the specification's reference implementations: the event is named by
// its signed webhook-id.
func ExampleStandardVerifier() {
	body := []byte(`{"test": 2432232314}`)
	r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(string(body)))
	r.Header.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	r.Header.Set("webhook-timestamp", "1614265330")
	r.Header.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	for _, now := range []time.Time{time.Unix(1614265330, 0), time.Unix(1614265330, 0).Add(time.Hour)} {
		v, err := webhook.NewStandardVerifier(webhook.StandardConfig{
			Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
			Now:     func() time.Time { return now },
		})
		if err != nil {
			log.Fatal(err)
		}
		err = v.Verify(r, body)
		id, _ := v.SignedID(r, body)
		fmt.Println(err == nil, errors.Is(err, webhook.ErrStaleSignature), id)
	}
	// Output:
	// true false msg_p5jXN8AQM9LWM0D4loKWxJek
	// false true msg_p5jXN8AQM9LWM0D4loKWxJek
}
