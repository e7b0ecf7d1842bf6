package consumer

import (
	"runtime/debug"

	"github.com/effectively-once/effectively/dedupe"
)

// keyer is the one place that turns a message into its dedupe key: the
// consumer's batches, Redrive and Classify (the replay dry run) all derive
// keys through it, so they cannot disagree.
type keyer struct {
	fn      KeyFunc
	scope   string
	noFP    bool
	fpJSON  bool
	maxLen  int
	checker dedupe.KeyChecker // the strategy's own rules, if it has any
}

func newKeyer(cfg Config, checker dedupe.KeyChecker) keyer {
	return keyer{fn: cfg.KeyFunc, scope: cfg.Scope, noFP: cfg.NoFingerprint, fpJSON: cfg.Fingerprint == FingerprintJSON,
		maxLen: cfg.MaxKeyLen, checker: checker}
}

// FingerprintMode says what a payload fingerprint hashes.
type FingerprintMode uint8

const (
	// FingerprintBytes hashes the payload's bytes: a payload re-serialized
	// with its members in another order is another payload.
	FingerprintBytes FingerprintMode = iota
	// FingerprintJSON hashes the payload's canonical JSON form
	// (dedupe.CanonicalJSON: members sorted, no insignificant whitespace,
	// values as given), so a producer that re-serializes an event does not
	// trip mismatch detection, and a changed value still does. A payload
	// that is not JSON has no key and is parked with reason invalid_key;
	// an empty one (a tombstone) is fingerprinted as empty bytes.
	FingerprintJSON
)

// fingerprint is the payload's fingerprint under the keyer's mode.
func (kr keyer) fingerprint(k dedupe.Key, payload []byte) ([]byte, error) {
	if !kr.fpJSON || len(payload) == 0 {
		return dedupe.Fingerprint(payload), nil
	}
	canon, err := dedupe.CanonicalJSON(payload)
	if err != nil {
		return nil, &dedupe.KeyError{Key: k, Reason: "Fingerprint is FingerprintJSON and the payload is not JSON: " + err.Error()}
	}
	return dedupe.Fingerprint(canon), nil
}

// key derives m's key with the KeyFunc, fills in the scope and the payload
// fingerprint, and validates it. An error means the message has no usable
// key and is parked with reason invalid_key. A panicking KeyFunc is a
// *PanicError.
func (kr keyer) key(m *Message) (k dedupe.Key, err error) {
	k, err = kr.call(m)
	if err != nil {
		return k, err
	}
	if k.Scope == "" {
		k.Scope = kr.scope
	}
	if k.Fingerprint == nil && !kr.noFP {
		if k.Fingerprint, err = kr.fingerprint(k, m.Value); err != nil {
			return k, err
		}
	}
	if err := dedupe.Validate(k, kr.maxLen); err != nil {
		return k, err
	}
	if k.ID == "" && k.Sender == "" {
		return k, &dedupe.KeyError{Key: k, Reason: "no dedupe key: the message has no ID and no sender"}
	}
	if kr.checker != nil {
		if err := kr.checker.CheckKey(k); err != nil {
			return k, err
		}
	}
	return k, nil
}

func (kr keyer) call(m *Message) (k dedupe.Key, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return kr.fn(m)
}

// deriveKeys is the first stage of a batch: every message's key, or the
// reason it has none, and how many of its deliveries were real attempts.
func (c *Consumer) deriveKeys(msgs []*Message) []*item {
	items := make([]*item, len(msgs))
	slab := make([]item, len(msgs)) // one allocation for the batch's items
	for i, m := range msgs {
		it := &slab[i]
		it.m, it.idx = m, i
		it.key, it.keyErr = c.keys.key(m)
		m.DedupeKey = it.key
		it.tries = c.attempts.failures(m)
		items[i] = it
	}
	return items
}
