package dedupe

import (
	"errors"
	"fmt"
)

// ErrInvalidKey is matched (with errors.Is) by every *KeyError.
var ErrInvalidKey = errors.New("dedupe: invalid key")

// KeyError reports a key that a strategy cannot store: missing, empty,
// oversized, not valid text, or lacking the fields the strategy needs.
// Consumers park the message with Reason instead of retrying it.
type KeyError struct {
	Key    Key
	Reason string
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("dedupe: invalid key %q: %s", e.Key.String(), e.Reason)
}

// Is makes errors.Is(err, ErrInvalidKey) true.
func (e *KeyError) Is(target error) bool { return target == ErrInvalidKey }
