package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Defaults of StandardConfig.
const (
	DefaultStandardPrefix    = "webhook"
	DefaultStandardTolerance = 5 * time.Minute
)

// StandardConfig configures a StandardVerifier.
type StandardConfig struct {
	// Secrets are the endpoint's signing secrets, as the provider shows
	// them: "whsec_" and the base64 of the key (the prefix may be left
	// out). A signature made with any of them is accepted, so that a
	// secret can be rolled: add the new one, then drop the old one once
	// the provider signs with the new. At least one is required.
	Secrets []string
	// Prefix names the three headers: <Prefix>-id, <Prefix>-timestamp and
	// <Prefix>-signature. Defaults to "webhook" (the specification's
	// names); "svix" reads Svix's older names.
	Prefix string
	// Tolerance is how far the timestamp may be from now, either way,
	// before the request is refused as stale. A negative value turns the
	// check off. Defaults to 5m (DefaultStandardTolerance), the
	// specification's recommendation.
	Tolerance time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// StandardVerifier checks signatures of the Standard Webhooks specification
// (https://www.standardwebhooks.com/), which Svix, Clerk, Resend and others
// send: the headers webhook-id (the message ID, the same in every retry),
// webhook-timestamp (Unix seconds) and webhook-signature, a space-separated
// list of "v1,<base64>" entries, each an HMAC-SHA256 under the secret of
// id + "." + timestamp + "." + body. A request passes when one v1 entry
// matches under one secret and the timestamp is within the tolerance;
// entries of other versions (v1a, asymmetric) are ignored. During a secret
// rotation a provider sends one entry per secret.
//
// The signature covers webhook-id, so the SignedID is webhook-id: a
// provider's retry (a fresh timestamp and signature) is a duplicate, and a
// captured request cannot be sent again under another ID.
type StandardVerifier struct {
	keys      [][]byte
	idH       string
	tsH       string
	sigH      string
	tolerance time.Duration
	now       func() time.Time
}

var _ SignedIDVerifier = (*StandardVerifier)(nil)

// NewStandardVerifier checks cfg and returns a StandardVerifier.
func NewStandardVerifier(cfg StandardConfig) (*StandardVerifier, error) {
	if len(cfg.Secrets) == 0 {
		return nil, &ConfigError{Package: "webhook", Field: "StandardConfig.Secrets", Reason: "at least one secret is required"}
	}
	v := &StandardVerifier{tolerance: cfg.Tolerance, now: cfg.Now}
	for i, s := range cfg.Secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil || len(key) == 0 {
			return nil, &ConfigError{Package: "webhook", Field: "StandardConfig.Secrets",
				Reason: fmt.Sprintf("secret %d is not whsec_ and a non-empty base64 key", i)}
		}
		v.keys = append(v.keys, key)
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = DefaultStandardPrefix
	}
	v.idH = http.CanonicalHeaderKey(prefix + "-id")
	v.tsH = http.CanonicalHeaderKey(prefix + "-timestamp")
	v.sigH = http.CanonicalHeaderKey(prefix + "-signature")
	if v.tolerance == 0 {
		v.tolerance = DefaultStandardTolerance
	}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

// Verify checks r's signature headers against body.
func (v *StandardVerifier) Verify(r *http.Request, body []byte) error {
	sigs := r.Header.Get(v.sigH)
	if sigs == "" {
		return fmt.Errorf("%w: header %s", ErrNoSignature, v.sigH)
	}
	id, ts := r.Header.Get(v.idH), r.Header.Get(v.tsH)
	if id == "" || ts == "" {
		return fmt.Errorf("%w: %s and %s are required", ErrMalformedSignature, v.idH, v.tsH)
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s %q is not a number", ErrMalformedSignature, v.tsH, ts)
	}
	var entries [][]byte
	for entry := range strings.FieldsSeq(sigs) {
		version, sig, ok := strings.Cut(entry, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err != nil || len(got) != sha256.Size {
			continue // matches nothing
		}
		entries = append(entries, got)
	}
	if len(entries) == 0 {
		return fmt.Errorf("%w: %s has no v1 signature (v1a is not supported)", ErrMalformedSignature, v.sigH)
	}
	matched := false
	for _, key := range v.keys {
		// Every secret and entry is tried, so the time taken does not
		// tell which matched.
		want := hmacSHA256(key, []byte(id), []byte("."), []byte(ts), []byte("."), body)
		for _, got := range entries {
			if hmac.Equal(got, want) {
				matched = true
			}
		}
	}
	if !matched {
		return fmt.Errorf("%w (%d v1 signatures in %s, %d secrets)", ErrSignatureMismatch, len(entries), v.sigH, len(v.keys))
	}
	if v.tolerance > 0 {
		skew := v.now().Sub(time.Unix(unix, 0))
		if skew > v.tolerance || skew < -v.tolerance {
			return fmt.Errorf("%w: signed at %s, %s from now, tolerance %s", ErrStaleSignature,
				time.Unix(unix, 0).UTC().Format(time.RFC3339), skew.Round(time.Second), v.tolerance)
		}
	}
	return nil
}

// SignedID returns the webhook-id header, which the signature covers.
func (v *StandardVerifier) SignedID(r *http.Request, _ []byte) (string, error) {
	id := r.Header.Get(v.idH)
	if id == "" {
		return "", fmt.Errorf("webhook: event ID: no %s header", v.idH)
	}
	return id, nil
}

// SignedHeaders returns the id and timestamp headers.
func (v *StandardVerifier) SignedHeaders() []string { return []string{v.idH, v.tsH} }
