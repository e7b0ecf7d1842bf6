package webhook

import (
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
// webhook's secret. Such a signature has no timestamp, so a captured
// request can be replayed at any time; the replay of an event the consumer
// has seen is a duplicate (within the strategy's retention).
type GitHubVerifier struct {
	secrets [][]byte
	header  string
}

var _ Verifier = (*GitHubVerifier)(nil)

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
