package franz

import (
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrAuthentication is matched (errors.Is) by the error Fetch returns when
// the brokers refused the source's SASL credentials (kgo.SASL in
// Config.Opts) or the TLS handshake failed on a certificate
// (kgo.DialTLSConfig): a wrong username or password, a mechanism the
// broker does not offer, a server certificate not signed by a trusted CA
// or not valid for the broker's name, a client certificate missing or
// refused. Retrying does not help, so the error is also permanent
// (consumer.IsPermanent): the consumer's Run stops with it. It is
// sources/kafka's ErrAuthentication, so one check covers both sources.
var ErrAuthentication = kafka.ErrAuthentication

// authError wraps an error that says the brokers refused the credentials.
type authError struct{ err error }

func (e *authError) Error() string        { return "authentication failed: " + e.err.Error() }
func (e *authError) Unwrap() error        { return e.err }
func (e *authError) Is(target error) bool { return target == ErrAuthentication }

// authFailure wraps err so that it matches ErrAuthentication when the
// brokers refused the credentials or certificates.
func authFailure(err error) error {
	if err == nil || errors.Is(err, ErrAuthentication) {
		return err
	}
	if errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) ||
		errors.Is(err, kerr.IllegalSaslState) {
		return &authError{err: err}
	}
	return kafka.AuthFailure(err)
}

// connectHook reports the connections the brokers refused for their
// credentials or certificates: kgo retries them on its own and its polls
// do not return the error, so Fetch would otherwise wait in silence.
type connectHook struct{ s *Source }

var _ kgo.HookBrokerConnect = connectHook{}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (h connectHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil || !errors.Is(authFailure(err), ErrAuthentication) {
		return
	}
	h.s.log.Error("franz: the broker refused the connection's credentials or certificates",
		"group", h.s.cfg.Group, "broker", net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))), "err", err)
	h.s.setError(err)
}
