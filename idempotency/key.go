package idempotency

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/fnv"
	"mime"
	"strings"

	"github.com/effectively-once/effectively/dedupe"
)

// parseKey returns the key a request's header values carry. The value is
// either a Structured Field string, as the IETF draft writes it
// ("8e03978e-…", in double quotes, with \" and \\ escaped), or the bare
// token most APIs send (Stripe's). The key must be 1 to maxLen bytes of
// printable ASCII. Several header lines are refused: which one counts
// would be a guess.
func parseKey(values []string, maxLen int) (string, error) {
	if len(values) > 1 {
		return "", errors.New("the request carries the key header more than once")
	}
	v := strings.TrimSpace(values[0])
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		inner := v[1 : len(v)-1]
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			switch {
			case c == '\\':
				if i+1 == len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
					return "", errors.New("the quoted key has a backslash that escapes neither \" nor \\")
				}
				i++
				b.WriteByte(inner[i])
			case c == '"':
				return "", errors.New("the quoted key has an unescaped \" inside")
			default:
				b.WriteByte(c)
			}
		}
		v = b.String()
	}
	switch {
	case v == "":
		return "", errors.New("the key is empty")
	case len(v) > maxLen:
		return "", fmt.Errorf("the key is %d bytes long, over the limit of %d", len(v), maxLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", fmt.Errorf("the key has a byte 0x%02x at offset %d; only printable ASCII is allowed", v[i], i)
		}
	}
	return v, nil
}

// isJSON reports whether a Content-Type names JSON: application/json or
// any type with the +json suffix (application/problem+json, …).
func isJSON(contentType string) bool {
	if contentType == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// Fingerprint returns the request fingerprint the middleware stores with a
// key: a hash of the method, the path, the query and the body, the body in
// canonical form when contentType names JSON (dedupe.CanonicalJSON: member
// order and insignificant whitespace do not count; every value does) and as
// raw bytes otherwise. It returns an error for a JSON content type whose
// body is not one JSON value. An empty body is hashed as empty whatever its
// type.
func Fingerprint(method, path, rawQuery, contentType string, body []byte) ([]byte, error) {
	canon := body
	if len(body) > 0 && isJSON(contentType) {
		c, err := dedupe.CanonicalJSON(body)
		if err != nil {
			return nil, err
		}
		canon = c
	}
	h := sha256.New()
	// Length-prefixed parts, so that no two requests run together into one
	// byte string.
	for _, p := range [...][]byte{[]byte(method), []byte(path), []byte(rawQuery), canon} {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return h.Sum(nil)[:dedupe.FingerprintLen], nil
}

// lockKey is the pg_try_advisory_xact_lock key of (scope, key): a 64-bit
// FNV-1a hash, prefixed so that it differs from the same pair's hash in
// other uses. Two pairs that hash alike only make one wait for (get 409
// while) the other.
func lockKey(scope, key string) int64 {
	h := fnv.New64a()
	h.Write([]byte("effectively.idempotency\x00"))
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int64(h.Sum64())
}
