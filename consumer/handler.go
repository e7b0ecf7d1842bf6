package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// Handler applies one new message's effect inside tx. Returning an error
// rolls back this message's effect and its dedupe marker (the rest of the
// batch still commits); the message is then retried, or parked when the
// error is permanent (see Permanent) or its attempts are used up.
//
// A handler must do all its writes through tx and must not commit or roll it
// back. It must return soon after ctx is done (pass ctx to every call that
// blocks): at shutdown, Run waits Config.ShutdownTimeout for it, then
// abandons its batch, which can no longer commit and is delivered again.
//
// A handler can run more than once for one delivery of a message: when a
// batch-mate fails, the batch's transaction rolls back and runs again
// without it (a healthy message runs at most twice this way, however many
// batch-mates fail, unless a handler fails only some of the time), and a
// batch whose transaction fails as a whole (a lost connection, a refused
// commit) runs again too. Only what the handler does through tx is rolled
// back each time: anything else it does (an HTTP call, a message sent, a
// counter in memory) happens again. BatchStats.Reruns counts these runs.
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// BatchHandler applies the effects of all new messages of a batch at once, so
// they can be written in bulk (unnest, COPY, pgx.Batch). If it returns an
// error, the consumer isolates the failing messages by bisecting the batch
// under savepoints and commits the rest; only the failing ones are retried
// or parked. A BatchHandler must therefore give the same result for any
// subset of msgs.
//
// While failing messages are isolated, a healthy message is handed to the
// BatchHandler again in each smaller group that is tried: about
// 1 + log2(batch size) times in the worst case, its effects rolled back
// each time but the last. As for Handler, anything done outside tx
// happens again each time; BatchStats.Reruns counts these runs.
type BatchHandler func(ctx context.Context, tx pgx.Tx, msgs []*Message) error

// JSON adapts a handler of decoded payloads. A payload that does not decode
// into T is a permanent failure (*DecodeError): the message is parked with
// the decoding error, not retried.
func JSON[T any](h func(ctx context.Context, tx pgx.Tx, m *Message, v T) error) Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		var v T
		if err := json.Unmarshal(m.Value, &v); err != nil {
			return &DecodeError{Err: err}
		}
		return h(ctx, tx, m, v)
	}
}

// KeyFunc derives the dedupe key of a message. A returned error parks the
// message with that reason. Fields left empty are filled by the consumer:
// Scope with Config.Scope, and Fingerprint with a hash of the payload unless
// Config.NoFingerprint is set.
type KeyFunc func(m *Message) (dedupe.Key, error)

// DefaultKey uses the source's default ID (Message.ID).
func DefaultKey(m *Message) (dedupe.Key, error) {
	return dedupe.Key{ID: m.ID}, nil
}

// JSONField returns a KeyFunc that reads the dedupe ID from a top-level
// string or number field of a JSON payload, such as "event_id".
func JSONField(field string) KeyFunc {
	return func(m *Message) (dedupe.Key, error) {
		id, err := JSONID(m.Value, field)
		return dedupe.Key{ID: id}, err
	}
}

// JSONID reads an ID from a JSON object payload: the member at path, one
// name per level, which must be a string (its value) or a number (as
// written). A payload that is not JSON is a *DecodeError. JSONField keys
// messages with it; sources that derive IDs from JSON bodies (the webhook
// source's JSONField) use it too.
func JSONID(payload []byte, path ...string) (string, error) {
	if len(path) == 0 {
		return "", errors.New("no member named for the ID")
	}
	where := strings.Join(path, ".")
	raw := json.RawMessage(payload)
	for i, name := range path {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			if i == 0 {
				return "", &DecodeError{Err: err}
			}
			return "", fmt.Errorf("payload field %q is not an object: %w", strings.Join(path[:i], "."), err)
		}
		v, ok := obj[name]
		if !ok {
			return "", fmt.Errorf("payload has no %q field", where)
		}
		raw = v
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("payload field %q is neither a string nor a number", where)
}
