package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kfake"
)

func skipOnRealCluster(t *testing.T) {
	t.Helper()
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, started with TLS or SASL")
	}
}

// TestTLS: Config.TLS (a custom CA, a client certificate for mutual TLS)
// reaches every connection of the source: the group coordinator, the
// partition fetches and the retention lookup. A consumer consumes every
// record exactly once over it.
func TestTLS(t *testing.T) {
	skipOnRealCluster(t)
	t.Parallel()
	ca := kafkatest.NewCA(t)
	scram512, err := scram.Mechanism(scram.SHA512, "ledger", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		server []kfake.Opt
		client *tls.Config
		sasl   sasl.Mechanism
	}{
		{
			name:   "mutual TLS",
			server: []kfake.Opt{kfake.TLS(ca.ServerTLS(t, true))},
			client: ca.ClientTLS(t, true),
		},
		{
			name:   "TLS and SCRAM-SHA-512",
			server: []kfake.Opt{kfake.TLS(ca.ServerTLS(t, false)), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "ledger", "s3cret")},
			client: ca.ClientTLS(t, false),
			sasl:   scram512,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := kafkatest.New(t, tc.server...)
			k.UseTLS(tc.client)
			if tc.sasl != nil {
				k.UseSASL(tc.sasl)
			}
			consumeSecured(t, k, func(c *Config) { c.TLS, c.SASL = tc.client, tc.sasl })
		})
	}
}

// consumeSecured runs a consumer over the source configured by mutate on a
// topic of two partitions, and checks that each of its records has exactly
// one effect and that the source read the topic's retention.
func consumeSecured(t *testing.T, k *kafkatest.Cluster, mutate func(*Config)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 40
	e := &env{t: t, kafka: k, topic: kafkatest.Name("secure"), group: kafkatest.Name("g"), partitions: 2, pool: pgtest.NewPool(t)}
	if err := k.CreateTopic(ctx, e.topic, e.partitions, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e.produce(0, n)
	s := e.source(mutate)
	c := consumertest.NewConsumer(t, e.pool, s, consumer.Config{
		Name: e.group, Strategy: newIDSet(t), Logger: testLogger(), RetryBackoff: 10 * time.Millisecond,
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, part, off, _ := Position(m)
			_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, off) VALUES ($1, $2, $3)`, m.ID, fmt.Sprint(part), off)
			return err
		},
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	var runErr error
	waitFor(t, 2*time.Minute, fmt.Sprintf("%d distinct effects", n), func() bool {
		select {
		case runErr = <-done:
			t.Fatalf("Run stopped before every record was consumed: %v", runErr)
		default:
		}
		_, d := e.effects()
		return d >= n
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Errorf("effects: %d rows of %d distinct records, want %d of %d", rows, distinct, n, n)
	}
	if got, err := s.RedeliveryHorizon(ctx); err != nil || got != time.Hour {
		t.Errorf("RedeliveryHorizon = %s, %v; want 1h (the topic's retention, read over the same connection settings)", got, err)
	}
}

func newIDSet(t *testing.T) *idset.Strategy {
	t.Helper()
	s, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTLSRefused: a client that does not trust the server's CA, a client
// without a certificate at a server that requires one, and a server name
// the certificate does not hold are refused; the consumer's Run stops with
// an error that says why, instead of retrying for ever.
func TestTLSRefused(t *testing.T) {
	skipOnRealCluster(t)
	t.Parallel()
	ca := kafkatest.NewCA(t)
	for _, tc := range []struct {
		name   string
		server *tls.Config
		client *tls.Config
		want   string
	}{
		{
			name:   "unknown CA",
			server: ca.ServerTLS(t, false),
			client: kafkatest.NewCA(t).ClientTLS(t, false),
			want:   "certificate signed by unknown authority",
		},
		{
			name:   "no client certificate",
			server: ca.ServerTLS(t, true),
			client: ca.ClientTLS(t, false),
			want:   "certificate required",
		},
		{
			name:   "wrong server name",
			server: ca.ServerTLS(t, false),
			client: func() *tls.Config { c := ca.ClientTLS(t, false); c.ServerName = "kafka.example.com"; return c }(),
			want:   "certificate is valid for",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := kafkatest.New(t, kfake.TLS(tc.server))
			err := runRefused(t, k, func(c *Config) { c.TLS = tc.client })
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// runRefused runs a consumer over a source of k configured by mutate, with
// no SourceFailureTimeout, and returns the error its Run stopped with: it
// must be permanent.
func runRefused(t *testing.T, k *kafkatest.Cluster, mutate func(*Config)) error {
	t.Helper()
	pool := pgtest.NewPool(t)
	e := &env{t: t, kafka: k, topic: kafkatest.Name("secure"), group: kafkatest.Name("g"), partitions: 1, pool: pool}
	src := e.source(mutate)
	c := consumertest.NewConsumer(t, pool, src, consumer.Config{
		Name: e.group, Strategy: newIDSet(t), Logger: testLogger(), RetryBackoff: 100 * time.Millisecond,
		Handler: func(context.Context, pgx.Tx, *consumer.Message) error { return nil },
	})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- c.Run(ctx) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run returned nil, want the connection's refusal")
		}
		t.Logf("Run stopped with: %v", err)
		if !errors.Is(err, consumer.ErrPermanent) || !errors.Is(err, ErrAuthentication) {
			t.Errorf("Run = %v, want a permanent error matching ErrAuthentication", err)
		}
		return err
	case <-time.After(2 * time.Minute):
		cancel()
		<-done
		t.Fatal("Run did not stop for a connection the brokers refuse: the refusal is retried for ever")
	}
	return nil
}

// Only refusals of credentials and certificates are permanent: an
// unreachable broker or a timeout is retried (and SourceFailureTimeout
// applies).
func TestAuthFailureClassification(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("could not authenticate: %w", kafkago.SASLAuthenticationFailed), true},
		{kafkago.UnsupportedSASLMechanism, true},
		{&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, true},
		{fmt.Errorf("failed to dial: %w", x509.HostnameError{Host: "kafka"}), true},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, true},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: internal error")}, false},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, false},
		{fmt.Errorf("failed to dial: %w", context.DeadlineExceeded), false},
		{io.EOF, false},
		{kafkago.RequestTimedOut, false},
	} {
		err := authFailure(tc.err)
		if got := errors.Is(err, ErrAuthentication); got != tc.want {
			t.Errorf("authFailure(%v) matches ErrAuthentication = %t, want %t", tc.err, got, tc.want)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("authFailure(%v) = %v, which does not wrap it", tc.err, err)
		}
	}
}
