package effprom

import (
	"errors"
	"fmt"
	"regexp"

	prom "github.com/prometheus/client_golang/prometheus"
)

// ErrInvalidOptions is matched by every error New returns for bad Options.
var ErrInvalidOptions = errors.New("effprom: invalid options")

// OptionsError reports a bad Options field.
type OptionsError struct {
	Field  string
	Reason string
}

func (e *OptionsError) Error() string {
	return fmt.Sprintf("effprom: invalid options: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidOptions) true.
func (e *OptionsError) Is(target error) bool { return target == ErrInvalidOptions }

// Options configures Metrics. The zero value is usable.
type Options struct {
	// Namespace prefixes every metric name, as in
	// effectively_messages_total. Defaults to "effectively".
	Namespace string
	// ConstLabels are added to every series, such as {"service": "billing"}.
	// They may not use the names of the package's own labels (consumer,
	// outcome, result, strategy, lane). Defaults to none.
	ConstLabels map[string]string
	// BatchSizeBuckets are the upper bounds of the batch size histogram, in
	// messages, strictly increasing. Defaults to DefaultBatchSizeBuckets.
	BatchSizeBuckets []float64
	// DurationBuckets are the upper bounds of the batch and phase duration
	// histograms, in seconds, strictly increasing. Defaults to
	// DefaultDurationBuckets.
	DurationBuckets []float64
	// MessageAgeBuckets are the upper bounds of the message age histogram,
	// in seconds, strictly increasing. Defaults to DefaultMessageAgeBuckets.
	MessageAgeBuckets []float64
}

var (
	// DefaultBatchSizeBuckets are the default Options.BatchSizeBuckets.
	DefaultBatchSizeBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}
	// DefaultDurationBuckets are the default Options.DurationBuckets: 0.5 ms
	// to about 16 s, doubling.
	DefaultDurationBuckets = prom.ExponentialBuckets(0.0005, 2, 16)
	// DefaultMessageAgeBuckets are the default Options.MessageAgeBuckets:
	// 10 ms to about 11.6 hours, by factors of 4.
	DefaultMessageAgeBuckets = prom.ExponentialBuckets(0.01, 4, 12)
)

var (
	namespaceRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	labelNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// ownLabels are the label names the package uses itself.
var ownLabels = []string{labelConsumer, labelOutcome, labelResult, labelStrategy, labelLane}

func (o Options) withDefaults() Options {
	if o.Namespace == "" {
		o.Namespace = "effectively"
	}
	if o.BatchSizeBuckets == nil {
		o.BatchSizeBuckets = DefaultBatchSizeBuckets
	}
	if o.DurationBuckets == nil {
		o.DurationBuckets = DefaultDurationBuckets
	}
	if o.MessageAgeBuckets == nil {
		o.MessageAgeBuckets = DefaultMessageAgeBuckets
	}
	return o
}

func (o Options) validate() error {
	if !namespaceRE.MatchString(o.Namespace) {
		return &OptionsError{Field: "Namespace", Reason: fmt.Sprintf("%q is not a valid metric name prefix (letters, digits and underscores, not starting with a digit)", o.Namespace)}
	}
	for name := range o.ConstLabels {
		if !labelNameRE.MatchString(name) || len(name) >= 2 && name[:2] == "__" {
			return &OptionsError{Field: "ConstLabels", Reason: fmt.Sprintf("%q is not a valid label name", name)}
		}
		for _, own := range ownLabels {
			if name == own {
				return &OptionsError{Field: "ConstLabels", Reason: fmt.Sprintf("label %q is set by the package itself", name)}
			}
		}
	}
	for _, b := range []struct {
		field   string
		buckets []float64
	}{
		{"BatchSizeBuckets", o.BatchSizeBuckets},
		{"DurationBuckets", o.DurationBuckets},
		{"MessageAgeBuckets", o.MessageAgeBuckets},
	} {
		if len(b.buckets) == 0 {
			return &OptionsError{Field: b.field, Reason: "must not be empty (leave it nil for the default)"}
		}
		for i := 1; i < len(b.buckets); i++ {
			if !(b.buckets[i] > b.buckets[i-1]) {
				return &OptionsError{Field: b.field, Reason: fmt.Sprintf("must be strictly increasing, got %v after %v", b.buckets[i], b.buckets[i-1])}
			}
		}
	}
	return nil
}
