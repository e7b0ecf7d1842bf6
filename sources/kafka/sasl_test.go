package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kfake"
)

// TestSASL: Config.SASL reaches every connection (group coordinator,
// partition readers, the retention lookup).
func TestSASL(t *testing.T) {
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, started with SASL")
	}
	mech := plain.Mechanism{Username: "ledger", Password: "s3cret"}
	k := kafkatest.New(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "ledger", "s3cret"))
	k.UseSASL(mech)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	topic := kafkatest.Name("secure")
	if err := k.CreateTopic(ctx, topic, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, topic, kafkago.Message{Value: []byte("a")}, kafkago.Message{Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, kafka: k, topic: topic, group: kafkatest.Name("g"), partitions: 1, pool: pgtest.NewPool(t)}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	s := e.source(func(c *Config) { c.SASL = mech })
	for seen := 0; seen < 2; {
		b, err := s.Fetch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		seen += len(b.Messages)
		if err := process(ctx, s, e.pool, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.RedeliveryHorizon(ctx); err != nil || got != time.Hour {
		t.Errorf("RedeliveryHorizon over SASL = %s, %v; want 1h", got, err)
	}
}

// TestSASLSCRAM: the SCRAM mechanisms, made by SASLMechanism, authenticate
// every connection of the source, as PLAIN does.
func TestSASLSCRAM(t *testing.T) {
	skipOnRealCluster(t)
	t.Parallel()
	for _, tc := range []struct{ name string }{{SASLScramSHA256}, {SASLScramSHA512}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mech, err := SASLMechanism(strings.ToLower(tc.name), "ledger", "s3cret")
			if err != nil {
				t.Fatal(err)
			}
			k := kafkatest.New(t, kfake.EnableSASL(), kfake.Superuser(tc.name, "ledger", "s3cret"))
			k.UseSASL(mech)
			consumeSecured(t, k, func(c *Config) { c.SASL = mech })
		})
	}
}

// TestSASLRefused: a wrong password (or a mechanism the user has no
// credentials for) stops the consumer's Run with an error that names the
// failed authentication, instead of retrying for ever.
func TestSASLRefused(t *testing.T) {
	skipOnRealCluster(t)
	t.Parallel()
	wrong256, err := scram.Mechanism(scram.SHA256, "ledger", "wrong")
	if err != nil {
		t.Fatal(err)
	}
	other512, err := scram.Mechanism(scram.SHA512, "ledger", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mech sasl.Mechanism
	}{
		{"PLAIN wrong password", plain.Mechanism{Username: "ledger", Password: "wrong"}},
		{"PLAIN unknown user", plain.Mechanism{Username: "nobody", Password: "s3cret"}},
		{"SCRAM-SHA-256 wrong password", wrong256},
		{"SCRAM-SHA-512 without credentials", other512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := kafkatest.New(t, kfake.EnableSASL(),
				kfake.Superuser("PLAIN", "ledger", "s3cret"), kfake.Superuser("SCRAM-SHA-256", "ledger", "s3cret"))
			err := runRefused(t, k, func(c *Config) { c.SASL = tc.mech })
			if !strings.Contains(err.Error(), "SASL Authentication Failed") {
				t.Errorf("Run = %v, want an error naming the failed SASL authentication", err)
			}
		})
	}
}

func TestSASLMechanism(t *testing.T) {
	for _, tc := range []struct {
		mechanism, user, pass string
		want                  string // the mechanism's Name, or a part of the error
	}{
		{"PLAIN", "u", "p", "PLAIN"},
		{"plain", "u", "p", "PLAIN"},
		{" scram-sha-256 ", "u", "p", "SCRAM-SHA-256"},
		{"SCRAM-SHA-512", "u", "p", "SCRAM-SHA-512"},
		{"GSSAPI", "u", "p", "unknown SASL mechanism \"GSSAPI\""},
		{"", "u", "p", "unknown SASL mechanism"},
		{"PLAIN", "", "p", "username is empty"},
		{"SCRAM-SHA-256", "u", "", "password is empty"},
	} {
		m, err := SASLMechanism(tc.mechanism, tc.user, tc.pass)
		switch {
		case err != nil && !strings.Contains(err.Error(), tc.want):
			t.Errorf("SASLMechanism(%q, %q, %q) = %v, want an error with %q", tc.mechanism, tc.user, tc.pass, err, tc.want)
		case err == nil && m.Name() != tc.want:
			t.Errorf("SASLMechanism(%q, %q, %q) = %s, want %s", tc.mechanism, tc.user, tc.pass, m.Name(), tc.want)
		}
	}
}

// A consumer of a cluster that takes SCRAM over TLS; the password comes
// from the environment, never from code or the command line.
func ExampleSASLMechanism() {
	mech, err := SASLMechanism("SCRAM-SHA-512", "ledger", cmp.Or(os.Getenv("KAFKA_PASSWORD"), "s3cret"))
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := Config{
		Brokers: []string{"kafka-1:9093"},
		Group:   "ledger",
		Topics:  []string{"transfers"},
		TLS:     &tls.Config{MinVersion: tls.VersionTLS12}, // RootCAs: nil trusts the system's CAs
		SASL:    mech,
	}
	fmt.Println(cfg.SASL.Name())
	// Output: SCRAM-SHA-512
}
