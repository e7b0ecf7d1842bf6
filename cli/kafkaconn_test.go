package cli_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/sources/kafka"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kfake"
)

// secured is a database and a cluster that takes only mutual TLS and
// SCRAM-SHA-256 (user "ops"), with the CA, the client certificate and the
// password in files.
type secured struct {
	*env
	k                                 *kafkatest.Cluster
	topic, group                      string
	caFile, certFile, keyFile, pwFile string
	clientTLS                         *tls.Config // trusts the CA, with a client certificate
	sasl                              sasl.Mechanism
}

const securedPartitions = 2

func newSecured(t *testing.T) *secured {
	t.Helper()
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, started with TLS and SASL")
	}
	ca := kafkatest.NewCA(t)
	k := kafkatest.New(t, kfake.TLS(ca.ServerTLS(t, true)), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "ops", "s3cret"))
	clientTLS := ca.ClientTLS(t, true)
	k.UseTLS(clientTLS)
	mech, err := kafka.SASLMechanism("SCRAM-SHA-256", "ops", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	k.UseSASL(mech)
	dir := t.TempDir()
	s := &secured{env: newEnv(t), k: k, topic: kafkatest.Name("transfers"), group: kafkatest.Name("ledger"),
		caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "client.pem"), keyFile: filepath.Join(dir, "client-key.pem"),
		pwFile: filepath.Join(dir, "password"), clientTLS: clientTLS, sasl: mech}
	certPEM, keyPEM := kafkatest.PEM(t, ca.Issue(t, false, "ops"))
	for name, data := range map[string][]byte{s.caFile: ca.PEM, s.certFile: certPEM, s.keyFile: keyPEM, s.pwFile: []byte("s3cret\n")} {
		if err := os.WriteFile(name, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.CreateTopic(ctx, s.topic, securedPartitions); err != nil {
		t.Fatal(err)
	}
	var msgs []kafkago.Message
	for i := range 20 {
		msgs = append(msgs, kafkago.Message{Partition: i % securedPartitions, Value: []byte(fmt.Sprint(i)),
			Headers: []kafkago.Header{{Key: kafka.DefaultIDHeader, Value: []byte(fmt.Sprintf("k-%d", i))}}})
	}
	if err := k.Produce(ctx, s.topic, msgs...); err != nil {
		t.Fatal(err)
	}
	s.must(stock, "migrate", "--kafka", "--yes")
	return s
}

// connFlags are the values of the connection flags; empty ones are left out.
type connFlags struct {
	brokers, ca, cert, key, mechanism, username, passwordFile, serverName string
	tls, insecure                                                         bool
}

// flags returns the flags that connect to the cluster.
func (s *secured) flags() connFlags {
	return connFlags{brokers: strings.Join(s.k.Brokers(), ","), ca: s.caFile, cert: s.certFile, key: s.keyFile,
		mechanism: "SCRAM-SHA-256", username: "ops", passwordFile: s.pwFile}
}

func (c connFlags) args() []string {
	var out []string
	for _, f := range []struct{ name, v string }{
		{"--brokers", c.brokers}, {"--tls-ca", c.ca}, {"--tls-cert", c.cert}, {"--tls-key", c.key},
		{"--sasl-mechanism", c.mechanism}, {"--sasl-username", c.username}, {"--sasl-password-file", c.passwordFile},
		{"--tls-server-name", c.serverName},
	} {
		if f.v != "" {
			out = append(out, f.name, f.v)
		}
	}
	if c.tls {
		out = append(out, "--tls")
	}
	if c.insecure {
		out = append(out, "--tls-insecure-skip-verify")
	}
	return out
}

func (s *secured) dryRunArgs(conn []string) []string {
	return append([]string{"replay", "--group", s.group, "--topic", s.topic, "--scope", "ledger", "--dry-run", "--json", "--to-offset", "0"}, conn...)
}

// replay and stats connect with mutual TLS and SCRAM, configured by flags:
// the dry run reads the range (metadata, offsets and records), stats reads
// the end offsets, and the replay checks the group's members and moves the
// stored offsets.
func TestKafkaTLSAndSASLFlags(t *testing.T) {
	t.Parallel()
	s := newSecured(t)

	r := s.must(stock, s.dryRunArgs(s.flags().args())...)
	var rep cli.DryRunReport
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	if rep.Total.Messages != 20 || rep.Total.New != 20 {
		t.Errorf("dry run over TLS and SASL: %+v, want 20 messages, all new", rep.Total)
	}

	if _, err := s.pool.Exec(context.Background(), `INSERT INTO effectively.kafka_offsets (group_id, topic, partition, next_offset, generation)
SELECT $1, $2, p, 10, 1 FROM generate_series(0, $3 - 1) AS p`, s.group, s.topic, securedPartitions); err != nil {
		t.Fatal(err)
	}
	r = s.must(stock, append([]string{"stats", "--json"}, s.flags().args()...)...)
	var st cli.StatsReport
	if err := json.Unmarshal([]byte(r.out), &st); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	for _, o := range st.KafkaOffsets {
		if o.Group == s.group && (o.EndOffset == nil || *o.EndOffset != 10 || o.Lag == nil || *o.Lag != 0) {
			t.Errorf("stats over TLS and SASL: partition %d: end offset %v, lag %v, want 10 and 0", o.Partition, o.EndOffset, o.Lag)
		}
	}

	s.must(stock, append([]string{"replay", "--group", s.group, "--topic", s.topic, "--to-offset", "0", "--yes"}, s.flags().args()...)...)
	if n := s.count(`SELECT count(*) FROM effectively.kafka_offsets WHERE group_id = $1 AND next_offset = 0`, s.group); n != securedPartitions {
		t.Errorf("after the replay over TLS and SASL, %d partitions are at offset 0, want %d", n, securedPartitions)
	}

	// The name the certificate holds, given explicitly; and no check at
	// all, which says so.
	c := s.flags()
	c.serverName = "localhost"
	s.must(stock, s.dryRunArgs(c.args())...)
	c = s.flags()
	c.ca, c.insecure = "", true
	r = s.must(stock, s.dryRunArgs(c.args())...)
	if !strings.Contains(r.err, "warning: --tls-insecure-skip-verify") {
		t.Errorf("--tls-insecure-skip-verify: stderr %q, want a warning", r.err)
	}
}

// A binary of its own configures TLS and SASL in code (Options.KafkaTLS,
// Options.KafkaSASL), for settings the flags do not offer; flags, when
// given, win.
func TestKafkaConnectionOptions(t *testing.T) {
	t.Parallel()
	s := newSecured(t)
	opts := cli.Options{KafkaTLS: s.clientTLS, KafkaSASL: s.sasl}
	r := s.must(opts, s.dryRunArgs([]string{"--brokers", strings.Join(s.k.Brokers(), ",")})...)
	var rep cli.DryRunReport
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	if rep.Total.Messages != 20 {
		t.Errorf("dry run with Options.KafkaTLS and KafkaSASL read %d messages, want 20", rep.Total.Messages)
	}
	wrong := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrong, []byte("guess"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := s.dryRunArgs([]string{"--brokers", strings.Join(s.k.Brokers(), ","),
		"--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "ops", "--sasl-password-file", wrong})
	if _, err := s.run(opts, "", args...); err == nil || !strings.Contains(err.Error(), "SASL Authentication Failed") {
		t.Errorf("--sasl-* flags over Options.KafkaSASL: %v, want the flags' (wrong) password refused", err)
	}
}

func TestKafkaPlainWithoutTLSWarns(t *testing.T) {
	t.Parallel()
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, started with SASL")
	}
	k := kafkatest.New(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "ops", "s3cret"))
	k.UseSASL(must(kafka.SASLMechanism("PLAIN", "ops", "s3cret")))
	e := newEnv(t)
	topic := kafkatest.Name("transfers")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.must(stock, "migrate", "--kafka", "--yes")
	r := e.must(stock, "replay", "--brokers", strings.Join(k.Brokers(), ","), "--group", "g", "--topic", topic, "--scope", "ledger",
		"--dry-run", "--to-offset", "0", "--sasl-mechanism", "PLAIN", "--sasl-username", "ops", "--sasl-password-file", pw)
	if !strings.Contains(r.err, "warning: SASL PLAIN without --tls sends the password in clear text") {
		t.Errorf("SASL PLAIN without TLS: stderr %q, want a warning", r.err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A refused password or certificate, and incomplete connection flags,
// fail the command with an error that says why.
func TestKafkaConnectionRefused(t *testing.T) {
	t.Parallel()
	s := newSecured(t)
	wrong := filepath.Join(t.TempDir(), "wrong")
	empty := filepath.Join(t.TempDir(), "empty")
	for name, data := range map[string]string{wrong: "guess\n", empty: "\n"} {
		if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*connFlags)
		want   string
	}{
		{"wrong password", func(c *connFlags) { c.passwordFile = wrong }, "SASL Authentication Failed"},
		{"wrong mechanism", func(c *connFlags) { c.mechanism = "SCRAM-SHA-512" }, "SASL Authentication Failed"},
		{"system CAs", func(c *connFlags) { c.ca, c.tls = "", true }, "certificate signed by unknown authority"},
		{"no client certificate", func(c *connFlags) { c.cert, c.key = "", "" }, "certificate required"},
		{"another server name", func(c *connFlags) { c.serverName = "kafka.example.com" }, "certificate is valid for localhost, not kafka.example.com"},
		{"no password", func(c *connFlags) { c.passwordFile = "" }, "needs a password: set $EFFECTIVELY_KAFKA_SASL_PASSWORD or --sasl-password-file"},
		{"empty password file", func(c *connFlags) { c.passwordFile = empty }, "is empty"},
		{"certificate without key", func(c *connFlags) { c.key = "" }, "--tls-cert and --tls-key go together"},
		{"unknown mechanism", func(c *connFlags) { c.mechanism = "GSSAPI" }, `unknown SASL mechanism "GSSAPI"`},
		{"username without mechanism", func(c *connFlags) { c.mechanism = "" }, "need --sasl-mechanism"},
		{"mechanism without username", func(c *connFlags) { c.username = "" }, "needs --sasl-username"},
		{"plaintext to TLS", func(c *connFlags) { c.ca, c.cert, c.key = "", "", "" }, "cannot connect to the brokers"},
		{"not a CA file", func(c *connFlags) { c.ca = s.pwFile }, "holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := s.flags()
			tc.mutate(&c)
			args := s.dryRunArgs(c.args())
			r, err := s.run(stock, "", args...)
			if err == nil {
				t.Fatalf("effectively %s succeeded, want an error\nstdout:\n%s", strings.Join(args, " "), r.out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("effectively %s: %v, want an error with %q", strings.Join(args, " "), err, tc.want)
			}
		})
	}
}

// Every connection flag has an environment variable as its default, and the
// password comes from $EFFECTIVELY_KAFKA_SASL_PASSWORD. (t.Setenv: not
// parallel.)
func TestKafkaConnectionFromEnv(t *testing.T) {
	s := newSecured(t)
	c := s.flags()
	for name, v := range map[string]string{
		"BROKERS": c.brokers, "TLS_CA": c.ca, "TLS_CERT": c.cert, "TLS_KEY": c.key,
		"SASL_MECHANISM": "scram-sha-256", "SASL_USERNAME": c.username, "SASL_PASSWORD": "s3cret",
	} {
		t.Setenv("EFFECTIVELY_KAFKA_"+name, v)
	}
	args := []string{"replay", "--group", s.group, "--topic", s.topic, "--scope", "ledger", "--dry-run", "--json", "--to-offset", "0"}
	r := s.must(stock, args...)
	var rep cli.DryRunReport
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	if rep.Total.Messages != 20 {
		t.Errorf("dry run configured by the environment read %d messages, want 20", rep.Total.Messages)
	}

	// A flag wins over its variable.
	if _, err := s.run(stock, "", append(args, "--sasl-username", "nobody")...); err == nil || !strings.Contains(err.Error(), "SASL Authentication Failed") {
		t.Errorf("--sasl-username nobody over $EFFECTIVELY_KAFKA_SASL_USERNAME: %v, want a refused authentication", err)
	}
	// The password once only.
	if _, err := s.run(stock, "", append(args, "--sasl-password-file", s.pwFile)...); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("--sasl-password-file with $EFFECTIVELY_KAFKA_SASL_PASSWORD: %v, want an error", err)
	}
	// A variable that is not a valid value names itself.
	t.Setenv("EFFECTIVELY_KAFKA_TLS", "maybe")
	if _, err := s.run(stock, "", args...); err == nil || !strings.Contains(err.Error(), "$EFFECTIVELY_KAFKA_TLS") {
		t.Errorf("EFFECTIVELY_KAFKA_TLS=maybe: %v, want an error naming the variable", err)
	}
}
