package franz

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

var refusedWait = 20 * time.Second

func skipOnRealCluster(t *testing.T) {
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, started with TLS or SASL")
	}
}

// secureEnv is an env on a cluster started with serverOpts, whose clients
// (the test's producer and admin requests) connect with client.
func secureEnv(t *testing.T, client []kgo.Opt, serverOpts ...kfake.Opt) *env {
	t.Helper()
	k := kafkatest.New(t, serverOpts...)
	e := &env{t: t, kafka: k, topic: kafkatest.Name("secure"), group: kafkatest.Name("g"), partitions: 2, pool: pgtest.NewPool(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Brokers()...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, client...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e.producer = p
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = e.topic, int32(e.partitions), 1
	retention := "3600000"
	rt.Configs = append(rt.Configs, kmsg.CreateTopicsRequestTopicConfig{Name: "retention.ms", Value: &retention})
	req.Topics = append(req.Topics, rt)
	if _, err := req.RequestWith(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestTLSAndSASL: the user's kgo options for TLS and SASL reach every
// connection of the source (the group, the fetches, the retention lookup).
func TestTLSAndSASL(t *testing.T) {
	skipOnRealCluster(t)
	t.Parallel()
	ca := kafkatest.NewCA(t)
	scram512 := scram.Auth{User: "ledger", Pass: "s3cret"}.AsSha512Mechanism()
	for _, tc := range []struct {
		name   string
		server []kfake.Opt
		client []kgo.Opt
	}{
		{"mutual TLS", []kfake.Opt{kfake.TLS(ca.ServerTLS(t, true))}, []kgo.Opt{kgo.DialTLSConfig(ca.ClientTLS(t, true))}},
		{"TLS and SCRAM-SHA-512",
			[]kfake.Opt{kfake.TLS(ca.ServerTLS(t, false)), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "ledger", "s3cret")},
			[]kgo.Opt{kgo.DialTLSConfig(ca.ClientTLS(t, false)), kgo.SASL(scram512)}},
		{"PLAIN", []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("PLAIN", "ledger", "s3cret")},
			[]kgo.Opt{kgo.SASL(plain.Auth{User: "ledger", Pass: "s3cret"}.AsMechanism())}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := secureEnv(t, tc.client, tc.server...)
			e.produce(0, 20)
			h := &consumertest.Counter{}
			src := e.source(func(c *Config) { c.Opts = append(c.Opts, tc.client...) })
			r := consumertest.Start(e.engine(src, h))
			e.waitEffects(20, 30*time.Second)
			r.Stop(t)
			if rows, distinct := e.effects(); rows != 20 || distinct != 20 {
				t.Fatalf("%d effect rows for %d distinct messages, want 20 of each", rows, distinct)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if got, err := src.RedeliveryHorizon(ctx); err != nil || got != time.Hour {
				t.Errorf("RedeliveryHorizon = %s, %v; want 1h", got, err)
			}
		})
	}
}

// TestAuthRefused: a server certificate signed by a CA the client does not
// trust, or a client certificate missing where the broker requires one,
// stops the consumer's Run with an error matching ErrAuthentication
// instead of retrying for ever. (kfake closes the connection on refused
// SASL credentials instead of answering SASL_AUTHENTICATION_FAILED as a
// Kafka broker does, so the SASL case is checked in TestAuthFailure.)
func TestAuthRefused(t *testing.T) {
	skipOnRealCluster(t)
	t.Parallel()
	ca := kafkatest.NewCA(t)
	for _, tc := range []struct {
		name          string
		server        []kfake.Opt
		admin, client []kgo.Opt
		want          string
	}{
		{"unknown CA", []kfake.Opt{kfake.TLS(ca.ServerTLS(t, false))},
			[]kgo.Opt{kgo.DialTLSConfig(ca.ClientTLS(t, false))},
			[]kgo.Opt{kgo.DialTLSConfig(kafkatest.NewCA(t).ClientTLS(t, false))}, "unknown authority"},
		{"no client certificate", []kfake.Opt{kfake.TLS(ca.ServerTLS(t, true))},
			[]kgo.Opt{kgo.DialTLSConfig(ca.ClientTLS(t, true))},
			[]kgo.Opt{kgo.DialTLSConfig(ca.ClientTLS(t, false))}, "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := secureEnv(t, tc.admin, tc.server...)
			src := e.source(func(c *Config) { c.Opts = append(c.Opts, tc.client...) })
			c := e.engine(src, &consumertest.Counter{})
			ctx, cancel := context.WithTimeout(context.Background(), refusedWait)
			defer cancel()
			err := c.Run(ctx)
			if ctx.Err() != nil {
				t.Fatalf("Run went on until the test's deadline: %v", err)
			}
			if !errors.Is(err, ErrAuthentication) || !consumer.IsPermanent(err) {
				t.Fatalf("Run = %v, want a permanent error matching ErrAuthentication", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run = %v, want it to name %q", err, tc.want)
			}
		})
	}
}

// TestAuthFailure: the errors franz-go returns for refused credentials and
// certificates match ErrAuthentication; others do not.
func TestAuthFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{kerr.SaslAuthenticationFailed, true},
		{fmt.Errorf("sasl: %w", kerr.UnsupportedSaslMechanism), true},
		{x509.UnknownAuthorityError{}, true},
		{kerr.NotCoordinator, false},
		{io.EOF, false},
	} {
		if got := errors.Is(authFailure(tc.err), ErrAuthentication); got != tc.want {
			t.Errorf("authFailure(%v) matches ErrAuthentication: %v, want %v", tc.err, got, tc.want)
		}
	}
}
