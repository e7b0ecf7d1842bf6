package dedupe

import (
	"errors"
	"fmt"
)

// ErrInvalidKey is matched (with errors.Is) by every *KeyError.
var ErrInvalidKey = errors.New("dedupe: invalid key")

// ErrInvalidConfig is matched by every configuration error from a strategy's
// constructor.
var ErrInvalidConfig = errors.New("dedupe: invalid config")

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

// ConfigError reports a bad configuration value.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("invalid config: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }
