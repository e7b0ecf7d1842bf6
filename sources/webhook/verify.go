package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
)

// Verifier checks that a request comes from the provider. The source calls
// it with the whole body, before anything else is done with the request;
// an error refuses the request (400 for an error matching
// ErrMalformedSignature, 401 for any other) and nothing of it is kept.
type Verifier interface {
	Verify(r *http.Request, body []byte) error
}

// SignedIDVerifier is a Verifier that can also name each verified request's
// event by what its signature covers, so that a captured delivery sent
// again with other unsigned headers is still the same event. GitHubVerifier
// (a hash of the body, the only thing its signature covers) and
// StandardVerifier (the webhook-id header, which its signature covers) are
// SignedIDVerifiers; the source asks New once whether a Verifier is one
// (see Config.ID).
type SignedIDVerifier interface {
	Verifier
	// SignedID returns the event ID of a request Verify accepted, derived
	// only from what the signature covers. Two requests with the same ID
	// carry the same signed content.
	SignedID(r *http.Request, body []byte) (string, error)
	// SignedHeaders returns the canonical names of the request headers
	// the signature covers besides the body; none for a signature over
	// the body alone.
	SignedHeaders() []string
}

// VerifierFunc is a function that is a Verifier.
type VerifierFunc func(r *http.Request, body []byte) error

// Verify calls f.
func (f VerifierFunc) Verify(r *http.Request, body []byte) error { return f(r, body) }

// Errors of the verifiers. Each matches ErrSignature too.
var (
	// ErrSignature matches every error of a verifier of this package.
	ErrSignature = errors.New("webhook: signature not verified")
	// ErrNoSignature: the request carries no signature header.
	ErrNoSignature = fmt.Errorf("%w: no signature", ErrSignature)
	// ErrMalformedSignature: the signature header cannot be read.
	ErrMalformedSignature = fmt.Errorf("%w: malformed signature header", ErrSignature)
	// ErrSignatureMismatch: no signature matches the body under any secret.
	ErrSignatureMismatch = fmt.Errorf("%w: no signature matches", ErrSignature)
	// ErrStaleSignature: the signature is right but its timestamp is
	// further from now than the verifier's tolerance (a replay, or a
	// clock far off).
	ErrStaleSignature = fmt.Errorf("%w: timestamp outside the tolerance", ErrSignature)
)

// unverified is the Verifier of Unverified.
type unverified struct{}

func (unverified) Verify(*http.Request, []byte) error { return nil }

// Unverified returns a Verifier that accepts every request. Use it only
// when something in front of the source authenticates the provider (a
// private network, mutual TLS): anyone who can reach the endpoint can
// otherwise make the handler apply anything. New logs a warning when it is
// used.
func Unverified() Verifier { return unverified{} }

// hmacSHA256 returns the HMAC-SHA256 of the parts, concatenated, under key.
func hmacSHA256(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// matchHex reports whether sig, in hex, is the HMAC-SHA256 of parts under
// one of secrets, comparing in constant time. A sig that is not hex
// matches nothing.
func matchHex(secrets [][]byte, sig string, parts ...[]byte) bool {
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return false
	}
	ok := false
	for _, s := range secrets {
		// Every secret is tried, so the time taken does not tell which.
		if hmac.Equal(got, hmacSHA256(s, parts...)) {
			ok = true
		}
	}
	return ok
}

// secretBytes checks and converts the secrets of a verifier's config.
func secretBytes(pkgField string, secrets []string) ([][]byte, error) {
	if len(secrets) == 0 {
		return nil, &ConfigError{Package: "webhook", Field: pkgField, Reason: "at least one secret is required"}
	}
	out := make([][]byte, len(secrets))
	for i, s := range secrets {
		if s == "" {
			return nil, &ConfigError{Package: "webhook", Field: pkgField, Reason: fmt.Sprintf("secret %d is empty", i)}
		}
		out[i] = []byte(s)
	}
	return out, nil
}
