package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// SASL mechanism names accepted by SASLMechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASLMechanism returns the kafka-go mechanism for Config.SASL named by
// mechanism (SASLPlain, SASLScramSHA256 or SASLScramSHA512, in any case),
// authenticating as username with password. Both must not be empty. PLAIN
// sends the password as it is: use it only together with Config.TLS.
// Other mechanisms (kafka-go's sasl/aws_msk_iam_v2, say) go into
// Config.SASL directly.
func SASLMechanism(mechanism, username, password string) (sasl.Mechanism, error) {
	name := strings.ToUpper(strings.TrimSpace(mechanism))
	switch name {
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
	default:
		return nil, fmt.Errorf("kafka: unknown SASL mechanism %q: want %s, %s or %s", mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
	switch {
	case username == "":
		return nil, fmt.Errorf("kafka: SASL %s: the username is empty", name)
	case password == "":
		return nil, fmt.Errorf("kafka: SASL %s: the password is empty", name)
	}
	switch name {
	case SASLPlain:
		return plain.Mechanism{Username: username, Password: password}, nil
	case SASLScramSHA256:
		m, err := scram.Mechanism(scram.SHA256, username, password)
		if err != nil {
			return nil, fmt.Errorf("kafka: SASL %s: %w", name, err)
		}
		return m, nil
	default:
		m, err := scram.Mechanism(scram.SHA512, username, password)
		if err != nil {
			return nil, fmt.Errorf("kafka: SASL %s: %w", name, err)
		}
		return m, nil
	}
}

// ErrAuthentication is matched (errors.Is) by the error Fetch returns when
// the brokers refused the source's credentials or the TLS handshake
// failed on a certificate: a wrong SASL username or password, a mechanism
// the broker does not offer, a server certificate not signed by a CA in
// Config.TLS.RootCAs or not valid for the broker's name, a client
// certificate missing or refused. Retrying does not help, so the error is
// also permanent (consumer.IsPermanent): the consumer's Run stops with it.
var ErrAuthentication = errors.New("kafka: authentication failed")

// authError wraps an error that isAuthFailure recognised.
type authError struct{ err error }

func (e *authError) Error() string        { return "authentication failed: " + e.err.Error() }
func (e *authError) Unwrap() error        { return e.err }
func (e *authError) Is(target error) bool { return target == ErrAuthentication }

// refusedAlerts are the TLS alerts, received from a broker, that say it
// refused this client's certificate or TLS settings. Others (an internal
// error, a bad record MAC) may be passing and are retried.
var refusedAlerts = map[string]bool{
	"tls: bad certificate":                true,
	"tls: unsupported certificate":        true,
	"tls: revoked certificate":            true,
	"tls: expired certificate":            true,
	"tls: unknown certificate":            true,
	"tls: unknown certificate authority":  true,
	"tls: access denied":                  true,
	"tls: certificate required":           true,
	"tls: handshake failure":              true,
	"tls: protocol version not supported": true,
	"tls: insufficient security level":    true,
	"tls: unrecognized name":              true,
}

// authFailure wraps err so that it matches ErrAuthentication when it says
// that the brokers refused the connection's credentials or certificates;
// other errors are returned as they are.
func authFailure(err error) error {
	if err == nil || errors.Is(err, ErrAuthentication) || !isAuthFailure(err) {
		return err
	}
	return &authError{err: err}
}

func isAuthFailure(err error) bool {
	if errors.Is(err, kafkago.SASLAuthenticationFailed) || errors.Is(err, kafkago.UnsupportedSASLMechanism) {
		return true
	}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil {
		return refusedAlerts[op.Err.Error()]
	}
	return false
}
