package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
)

// DefaultGitHubHeader is GitHubConfig.Header's default.
const DefaultGitHubHeader = "X-Hub-Signature-256"

// GitHubConfig configures a GitHubVerifier.
type GitHubConfig struct {
	// Secrets are the webhook's secrets. A signature made with any of them
	// is accepted, so that a secret can be rolled. At least one is
	// required.
	Secrets []string
	// Header is the signature header. Defaults to "X-Hub-Signature-256".
	Header string
}

// GitHubVerifier checks signatures in the style of GitHub's webhooks: a
// header "sha256=<hex>" holding the HMAC-SHA256 of the body under the
// webhook's secret. Such a signature covers the body and nothing else (not
// the X-GitHub-Delivery header) and has no timestamp, so a captured
// request can be replayed at any time, with any delivery ID. Its SignedID
// is therefore a hash of the body: a replay of an event the consumer has
// seen is a duplicate (within the strategy's retention), whatever headers
// it comes with.
type GitHubVerifier struct {
	secrets [][]byte
	header  string
}

var _ SignedIDVerifier = (*GitHubVerifier)(nil)

// NewGitHubVerifier checks cfg and returns a GitHubVerifier.
func NewGitHubVerifier(cfg GitHubConfig) (*GitHubVerifier, error) {
	secrets, err := secretBytes("GitHubConfig.Secrets", cfg.Secrets)
	if err != nil {
		return nil, err
	}
	v := &GitHubVerifier{secrets: secrets, header: cfg.Header}
	if v.header == "" {
		v.header = DefaultGitHubHeader
	}
	return v, nil
}

// Verify checks r's signature header against body.
func (v *GitHubVerifier) Verify(r *http.Request, body []byte) error {
	h := r.Header.Get(v.header)
	if h == "" {
		return fmt.Errorf("%w: header %s", ErrNoSignature, v.header)
	}
	sig, ok := strings.CutPrefix(strings.TrimSpace(h), "sha256=")
	if !ok {
		return fmt.Errorf("%w: %s does not start with sha256=", ErrMalformedSignature, v.header)
	}
	if !matchHex(v.secrets, sig, body) {
		return fmt.Errorf("%w (%s, %d secrets)", ErrSignatureMismatch, v.header, len(v.secrets))
	}
	return nil
}

// SignedID returns "sha256:" and the hex SHA-256 of body: the event named
// by what the signature covers. GitHub's redeliveries send the body of the
// first delivery byte for byte, so they are duplicates of it.
func (v *GitHubVerifier) SignedID(_ *http.Request, body []byte) (string, error) {
	return BodyID(body), nil
}

// SignedHeaders returns nil: the signature covers the body alone.
func (v *GitHubVerifier) SignedHeaders() []string { return nil }

// BodyID returns "sha256:" and the hex SHA-256 of body, the event ID of a
// delivery named by its signed body (GitHubVerifier's SignedID).
func BodyID(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}
