package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// JSONField returns an IDFunc that reads the event ID from the JSON body:
// the member path names, one level each (JSONField("id") for Stripe's
// event ID, JSONField("data", "id") one level down). The value must be a
// non-empty string or a number (taken as written).
func JSONField(path ...string) IDFunc {
	where := strings.Join(path, ".")
	return func(_ *http.Request, body []byte) (string, error) {
		if len(path) == 0 {
			return "", errors.New("webhook: JSONField needs a member name")
		}
		raw := json.RawMessage(body)
		for _, name := range path {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil {
				return "", fmt.Errorf("webhook: event ID %s: body is not a JSON object there: %w", where, err)
			}
			v, ok := obj[name]
			if !ok {
				return "", fmt.Errorf("webhook: event ID %s: no member %q", where, name)
			}
			raw = v
		}
		raw = bytes.TrimSpace(raw)
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			if s == "" {
				return "", fmt.Errorf("webhook: event ID %s is empty", where)
			}
			return s, nil
		}
		var n json.Number
		if err := json.Unmarshal(raw, &n); err == nil {
			return string(raw), nil
		}
		return "", fmt.Errorf("webhook: event ID %s is %s, not a string or number", where, raw)
	}
}

// Header returns an IDFunc that takes the event ID from a request header
// (Header("X-GitHub-Delivery") for GitHub, whose redeliveries carry the
// delivery's GUID again). A missing or empty header is an error.
func Header(name string) IDFunc {
	return func(r *http.Request, _ []byte) (string, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return "", fmt.Errorf("webhook: event ID: no %s header", name)
		}
		return v, nil
	}
}
