package dedupe

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"unicode/utf8"
)

// DefaultMaxIDLen is the longest Key.ID, in bytes, that Validate accepts when
// no other limit is configured.
const DefaultMaxIDLen = 512

// FingerprintLen is the length of the fingerprints made by Fingerprint.
const FingerprintLen = 16

// Key identifies one logical message to a Strategy.
//
// Which fields matter depends on the strategy: idset and bloom use (Scope, ID);
// highwater uses (Scope, Sender, Seq). Fingerprint is optional for all of them:
// when set, a second message with the same key but another fingerprint gets
// VerdictMismatch instead of VerdictDuplicate.
type Key struct {
	// Scope namespaces the key. Two scopes never see each other's markers.
	// The consumer fills it with its name when left empty.
	Scope string
	// ID is the message's identity, such as an idempotency key or event ID.
	ID string
	// Sender names the producer whose messages Seq numbers.
	Sender string
	// Seq is the sender's sequence number for this message, starting at 1.
	// Zero means the message carries no sequence number.
	Seq int64
	// Fingerprint is a hash of the payload, stored with the marker.
	Fingerprint []byte
}

// String renders the key for logs and errors.
func (k Key) String() string {
	if k.Sender != "" || k.Seq != 0 {
		return fmt.Sprintf("%s/%s#%d", k.Scope, k.Sender, k.Seq)
	}
	return k.Scope + "/" + k.ID
}

// SameFingerprint reports whether two fingerprints agree. A missing
// fingerprint on either side agrees with anything: it cannot prove a mismatch.
func SameFingerprint(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	return bytes.Equal(a, b)
}

// Fingerprint hashes a payload into a FingerprintLen-byte fingerprint
// (a truncated SHA-256).
func Fingerprint(payload []byte) []byte {
	sum := sha256.Sum256(payload)
	return sum[:FingerprintLen]
}

// Validate checks the parts of k that every strategy stores as text: Scope,
// ID and Sender must be valid UTF-8 without NUL bytes (PostgreSQL text cannot
// hold NUL), at most maxLen bytes long (DefaultMaxIDLen when maxLen <= 0),
// and Seq must not be negative. It does not check that the fields a
// particular strategy needs are present; strategies report that themselves
// with a *KeyError.
func Validate(k Key, maxLen int) error {
	if maxLen <= 0 {
		maxLen = DefaultMaxIDLen
	}
	if k.Scope == "" {
		return &KeyError{Key: k, Reason: "empty scope"}
	}
	for _, f := range [...]struct{ name, v string }{{"scope", k.Scope}, {"id", k.ID}, {"sender", k.Sender}} {
		if err := checkText(f.v, maxLen); err != "" {
			return &KeyError{Key: k, Reason: f.name + " " + err}
		}
	}
	if k.Seq < 0 {
		return &KeyError{Key: k, Reason: fmt.Sprintf("negative sequence number %d", k.Seq)}
	}
	return nil
}

func checkText(s string, maxLen int) string {
	switch {
	case len(s) > maxLen:
		return fmt.Sprintf("is %d bytes long, over the limit of %d", len(s), maxLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case bytes.IndexByte([]byte(s), 0) >= 0:
		return "contains a NUL byte"
	}
	return ""
}
