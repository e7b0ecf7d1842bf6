package webhook

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Defaults of StripeConfig.
const (
	DefaultStripeHeader    = "Stripe-Signature"
	DefaultStripeTolerance = 5 * time.Minute
)

// StripeConfig configures a StripeVerifier.
type StripeConfig struct {
	// Secrets are the endpoint's signing secrets ("whsec_…", used whole as
	// the HMAC key, as Stripe does). A signature made with any of them is
	// accepted, so that a secret can be rolled: add the new one, then drop
	// the old one once the provider signs with the new. At least one is
	// required.
	Secrets []string
	// Header is the signature header. Defaults to "Stripe-Signature".
	Header string
	// Tolerance is how far a signature's timestamp may be from now, either
	// way, before the request is refused as stale: a captured request
	// cannot be replayed later than that. A negative value turns the check
	// off. Defaults to 5m (DefaultStripeTolerance), Stripe's own default.
	Tolerance time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// StripeVerifier checks signatures in the style of Stripe's webhooks: a
// header "t=<unix seconds>,v1=<hex>[,v1=<hex>…]" where each v1 value is an
// HMAC-SHA256, under an endpoint secret, of the timestamp, a dot and the
// body. The request passes when one v1 value matches under one secret and
// the timestamp is within the tolerance; other schemes (v0) are ignored.
// Any provider that signs this way can use it.
type StripeVerifier struct {
	secrets   [][]byte
	header    string
	tolerance time.Duration
	now       func() time.Time
}

var _ Verifier = (*StripeVerifier)(nil)

// NewStripeVerifier checks cfg and returns a StripeVerifier.
func NewStripeVerifier(cfg StripeConfig) (*StripeVerifier, error) {
	secrets, err := secretBytes("StripeConfig.Secrets", cfg.Secrets)
	if err != nil {
		return nil, err
	}
	v := &StripeVerifier{secrets: secrets, header: cfg.Header, tolerance: cfg.Tolerance, now: cfg.Now}
	if v.header == "" {
		v.header = DefaultStripeHeader
	}
	if v.tolerance == 0 {
		v.tolerance = DefaultStripeTolerance
	}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

// Verify checks r's signature header against body.
func (v *StripeVerifier) Verify(r *http.Request, body []byte) error {
	h := r.Header.Get(v.header)
	if h == "" {
		return fmt.Errorf("%w: header %s", ErrNoSignature, v.header)
	}
	var (
		ts     string
		sigs   []string
		hasTS  bool
		parsed int64
	)
	for part := range strings.SplitSeq(h, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			if hasTS {
				return fmt.Errorf("%w: %s has two timestamps", ErrMalformedSignature, v.header)
			}
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return fmt.Errorf("%w: %s timestamp %q is not a number", ErrMalformedSignature, v.header, val)
			}
			ts, parsed, hasTS = val, n, true
		case "v1":
			sigs = append(sigs, val)
		}
	}
	if !hasTS || len(sigs) == 0 {
		return fmt.Errorf("%w: %s needs t= and at least one v1=", ErrMalformedSignature, v.header)
	}
	matched := false
	for _, sig := range sigs {
		if matchHex(v.secrets, sig, []byte(ts), []byte("."), body) {
			matched = true
		}
	}
	if !matched {
		return fmt.Errorf("%w (%d v1 values in %s, %d secrets)", ErrSignatureMismatch, len(sigs), v.header, len(v.secrets))
	}
	if v.tolerance > 0 {
		skew := v.now().Sub(time.Unix(parsed, 0))
		if skew > v.tolerance || skew < -v.tolerance {
			return fmt.Errorf("%w: signed at %s, %s from now, tolerance %s", ErrStaleSignature,
				time.Unix(parsed, 0).UTC().Format(time.RFC3339), skew.Round(time.Second), v.tolerance)
		}
	}
	return nil
}
