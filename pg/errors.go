package pg

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is matched by every configuration error of the library:
// errors.Is(err, ErrInvalidConfig) holds for an error from any constructor
// given a bad Config (idset.New, consumer.New, kafka.New, …). The packages
// with a Config export it under the same name, as the same value, so
// errors.Is(err, consumer.ErrInvalidConfig) and errors.Is(err,
// kafka.ErrInvalidConfig) agree.
var ErrInvalidConfig = errors.New("invalid config")

// ConfigError reports a bad configuration value: the package whose Config
// holds it, the field, and what is wrong with it. It is the one
// configuration error of the library (consumer.ConfigError,
// kafka.ConfigError and sqs.ConfigError are other names for it), and it
// matches ErrInvalidConfig.
type ConfigError struct {
	// Package names the package whose Config holds the field: "consumer",
	// "idset", "kafka", …
	Package string
	// Field is the Config field's name, such as "Schema".
	Field string
	// Reason says which check the value failed.
	Reason string
}

// ConfigErrorf returns a *ConfigError for pkg's field, with its Reason
// formatted from format and args.
func ConfigErrorf(pkg, field, format string, args ...any) *ConfigError {
	return &ConfigError{Package: pkg, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func (e *ConfigError) Error() string {
	if e.Package == "" {
		return fmt.Sprintf("invalid config: %s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("%s: invalid config: %s: %s", e.Package, e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }
