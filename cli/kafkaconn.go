package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/spf13/pflag"
)

// Environment variables of the Kafka connection. Each connection flag
// --NAME also has the default $EFFECTIVELY_KAFKA_NAME (upper case, "-" as
// "_"); the password has only the variable (or --sasl-password-file).
const (
	envPrefix   = "EFFECTIVELY_KAFKA_"
	envPassword = envPrefix + "SASL_PASSWORD"
)

// kafkaConnHelp documents the connection flags, in the help of the
// commands that talk to Kafka.
const kafkaConnHelp = `Connecting to Kafka: --tls turns on TLS (any other --tls-* flag implies
it). --tls-ca names a PEM file of the CA certificates that signed the
brokers' certificates (instead of the system's); --tls-cert and --tls-key a
PEM client certificate and its key, for mutual TLS; --tls-server-name the
name the brokers' certificates must hold (default: each broker's host);
--tls-insecure-skip-verify accepts any certificate (for tests only).
--sasl-mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) and
--sasl-username authenticate with SASL. The password is read from
$` + envPassword + ` or from the file named by
--sasl-password-file (its trailing newline removed), never from the
command line.

Each connection flag --NAME defaults to the environment variable
EFFECTIVELY_KAFKA_NAME (upper case, "-" as "_"): $` + envPrefix + `BROKERS,
$` + envPrefix + `TLS_CA, $` + envPrefix + `SASL_MECHANISM, ...; a flag on the
command line wins. The tool connects once before it reads anything, so a
refused password or certificate fails the command at once, with the
brokers' reason.`

// kafkaConn holds the connection flags of a command that talks to Kafka.
type kafkaConn struct {
	tls              bool
	tlsCA            string
	tlsCert          string
	tlsKey           string
	tlsServerName    string
	tlsInsecure      bool
	saslMechanism    string
	saslUsername     string
	saslPasswordFile string

	// Options.KafkaTLS and KafkaSASL, used when no flag sets TLS or SASL.
	defaultTLS  *tls.Config
	defaultSASL sasl.Mechanism
}

// kafkaConn returns the connection settings of a command, before its flags.
func (a *app) kafkaConn() kafkaConn {
	return kafkaConn{defaultTLS: a.opts.KafkaTLS, defaultSASL: a.opts.KafkaSASL}
}

// addFlags registers the connection flags on f.
func (k *kafkaConn) addFlags(f *pflag.FlagSet) {
	f.BoolVar(&k.tls, "tls", false, "connect to the brokers with TLS")
	f.StringVar(&k.tlsCA, "tls-ca", "", "PEM file of the CA certificates the brokers' certificates are checked against (default: the system's)")
	f.StringVar(&k.tlsCert, "tls-cert", "", "PEM file of the client certificate, for mutual TLS (with --tls-key)")
	f.StringVar(&k.tlsKey, "tls-key", "", "PEM file of the client certificate's private key (with --tls-cert)")
	f.StringVar(&k.tlsServerName, "tls-server-name", "", "name the brokers' certificates must hold (default: each broker's host)")
	f.BoolVar(&k.tlsInsecure, "tls-insecure-skip-verify", false, "accept any broker certificate (tests only: anyone in the middle can read the traffic)")
	f.StringVar(&k.saslMechanism, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default: no SASL)")
	f.StringVar(&k.saslUsername, "sasl-username", "", "SASL username")
	f.StringVar(&k.saslPasswordFile, "sasl-password-file", "", "file holding the SASL password (default: $"+envPassword+")")
}

// connFlags are the flags that take their default from the environment.
var connFlags = []string{"brokers", "tls", "tls-ca", "tls-cert", "tls-key", "tls-server-name",
	"tls-insecure-skip-verify", "sasl-mechanism", "sasl-username", "sasl-password-file"}

// envName is the environment variable holding flag's default.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// fromEnv sets the connection flags of f that were not given on the
// command line from their environment variables.
func (*kafkaConn) fromEnv(f *pflag.FlagSet) error {
	for _, name := range connFlags {
		fl := f.Lookup(name)
		if fl == nil || fl.Changed {
			continue
		}
		v := os.Getenv(envName(name))
		if v == "" {
			continue
		}
		if err := fl.Value.Set(v); err != nil {
			return fmt.Errorf("$%s: %q is not a valid --%s: %w", envName(name), v, name, err)
		}
	}
	return nil
}

// tlsConfig returns the TLS settings of the flags, or nil without TLS.
func (k *kafkaConn) tlsConfig(stderr io.Writer) (*tls.Config, error) {
	if !k.tls && k.tlsCA == "" && k.tlsCert == "" && k.tlsKey == "" && k.tlsServerName == "" && !k.tlsInsecure {
		return k.defaultTLS, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.tlsServerName, InsecureSkipVerify: k.tlsInsecure}
	if k.tlsCA != "" {
		pem, err := os.ReadFile(k.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca: %s holds no PEM certificate", k.tlsCA)
		}
		c.RootCAs = pool
	}
	switch {
	case (k.tlsCert == "") != (k.tlsKey == ""):
		return nil, errors.New("--tls-cert and --tls-key go together: give both for a client certificate, or neither")
	case k.tlsCert != "":
		cert, err := tls.LoadX509KeyPair(k.tlsCert, k.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if k.tlsInsecure {
		fmt.Fprintln(stderr, "warning: --tls-insecure-skip-verify: the brokers' certificates are not checked")
	}
	return c, nil
}

// mechanism returns the SASL mechanism of the flags, or nil without SASL.
func (k *kafkaConn) mechanism(withTLS bool, stderr io.Writer) (sasl.Mechanism, error) {
	if k.saslMechanism == "" {
		if k.saslUsername != "" || k.saslPasswordFile != "" {
			return nil, errors.New("--sasl-username and --sasl-password-file need --sasl-mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return k.defaultSASL, nil
	}
	if k.saslUsername == "" {
		return nil, fmt.Errorf("--sasl-mechanism %s needs --sasl-username", k.saslMechanism)
	}
	pass := os.Getenv(envPassword)
	if k.saslPasswordFile != "" {
		if pass != "" {
			return nil, fmt.Errorf("the SASL password is given twice: by --sasl-password-file and by $%s; give one", envPassword)
		}
		b, err := os.ReadFile(k.saslPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("--sasl-password-file: %w", err)
		}
		pass = strings.TrimRight(string(b), "\r\n")
		if pass == "" {
			return nil, fmt.Errorf("--sasl-password-file: %s is empty", k.saslPasswordFile)
		}
	}
	if pass == "" {
		return nil, fmt.Errorf("--sasl-mechanism %s needs a password: set $%s or --sasl-password-file (it is never taken from the command line)", k.saslMechanism, envPassword)
	}
	m, err := kafka.SASLMechanism(k.saslMechanism, k.saslUsername, pass)
	if err != nil {
		return nil, fmt.Errorf("--sasl-mechanism: %w", err)
	}
	if m.Name() == kafka.SASLPlain && !withTLS {
		fmt.Fprintln(stderr, "warning: SASL PLAIN without --tls sends the password in clear text")
	}
	return m, nil
}
