package webhook

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/effectively-once/effectively/consumer"
)

// JSONField returns an IDFunc that reads the event ID from the JSON body:
// the member path names, one level each (JSONField("id") for Stripe's
// event ID, JSONField("data", "id") one level down). The value must be a
// non-empty string or a number (taken as written).
func JSONField(path ...string) IDFunc {
	where := strings.Join(path, ".")
	return func(_ *http.Request, body []byte) (string, error) {
		id, err := consumer.JSONID(body, path...)
		if err == nil && id == "" {
			err = errors.New("it is empty")
		}
		if err != nil {
			return "", fmt.Errorf("webhook: event ID %s: %w", where, err)
		}
		return id, nil
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
