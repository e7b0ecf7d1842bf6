package highwater

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/effectively-once/effectively/dedupe"
)

// Default header names read by HeaderKey when none are configured.
const (
	DefaultSenderHeader = "sender"
	DefaultSeqHeader    = "seq"
)

var (
	// ErrMalformedSeq is matched by every error ParseSeq returns.
	ErrMalformedSeq = errors.New("highwater: malformed sequence number")
	// ErrMissingHeader is matched by HeaderKey's errors for an absent or
	// empty sender or sequence header.
	ErrMissingHeader = errors.New("highwater: missing header")
)

// SeqError reports a sequence number that is not a positive decimal integer
// that fits in an int64.
type SeqError struct {
	// Value is the text that was parsed.
	Value string
	// Reason says what is wrong with it.
	Reason string
}

func (e *SeqError) Error() string {
	return fmt.Sprintf("highwater: sequence number %q %s", e.Value, e.Reason)
}

// Is makes errors.Is(err, ErrMalformedSeq) true.
func (e *SeqError) Is(target error) bool { return target == ErrMalformedSeq }

const maxQuoted = 40

// ParseSeq parses a sequence number: a decimal integer of digits only (no
// sign, spaces or fraction), at least 1, that fits in an int64. Any other
// input gets a *SeqError saying what is wrong.
func ParseSeq(s string) (int64, error) {
	shown := s
	if len(shown) > maxQuoted {
		shown = shown[:maxQuoted] + "…"
	}
	fail := func(format string, args ...any) (int64, error) {
		return 0, &SeqError{Value: shown, Reason: fmt.Sprintf(format, args...)}
	}
	if s == "" {
		return fail("is empty")
	}
	digits := true
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			digits = false
			break
		}
	}
	if !digits {
		if s[0] == '-' {
			if _, err := strconv.ParseInt(s, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
				return fail("is negative; sequence numbers start at 1")
			}
		}
		return fail("is not a decimal integer (digits 0-9 only, no sign, spaces or fraction)")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fail("overflows a 64-bit integer (the largest is %d)", int64(1<<63-1))
	}
	if n == 0 {
		return fail("is zero; sequence numbers start at 1")
	}
	return n, nil
}

// HeaderKey reads a message's sender and sequence number from two headers,
// through lookup (such as the Header method of a consumer.Message), and
// returns a key with Sender and Seq set. Empty header names default to
// DefaultSenderHeader and DefaultSeqHeader. A missing or empty header is an
// error matching ErrMissingHeader; a malformed sequence number is a
// *SeqError. Both are meant to park the message with that reason.
func HeaderKey(lookup func(name string) ([]byte, bool), senderHeader, seqHeader string) (dedupe.Key, error) {
	if senderHeader == "" {
		senderHeader = DefaultSenderHeader
	}
	if seqHeader == "" {
		seqHeader = DefaultSeqHeader
	}
	sender, ok := lookup(senderHeader)
	if !ok {
		return dedupe.Key{}, fmt.Errorf("%w: no %q header naming the sender", ErrMissingHeader, senderHeader)
	}
	if len(sender) == 0 {
		return dedupe.Key{}, fmt.Errorf("%w: header %q naming the sender is empty", ErrMissingHeader, senderHeader)
	}
	raw, ok := lookup(seqHeader)
	if !ok {
		return dedupe.Key{}, fmt.Errorf("%w: no %q header with the sequence number", ErrMissingHeader, seqHeader)
	}
	seq, err := ParseSeq(string(raw))
	if err != nil {
		return dedupe.Key{}, fmt.Errorf("header %q: %w", seqHeader, err)
	}
	return dedupe.Key{Sender: string(sender), Seq: seq}, nil
}
