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

// Header returns an IDFunc that takes the event ID from a request header,
// which must be one the provider's signature covers: otherwise a captured
// delivery sent again with another value is a new event, applied twice.
// (With a SignedIDVerifier the source sees to that: a header the verifier
// does not sign is not there for the IDFunc, and the SignedID names the
// event; GitHub's X-GitHub-Delivery is such a header.) A missing or empty
// header is an error.
func Header(name string) IDFunc {
	return func(r *http.Request, _ []byte) (string, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return "", fmt.Errorf("webhook: event ID: no %s header", name)
		}
		return v, nil
	}
}

// eventID derives the event ID of a verified request. With a
// SignedIDVerifier, Config.ID sees only what the signature covers, and the
// verifier's SignedID names the event when Config.ID is unset or cannot.
func (s *Source) eventID(r *http.Request, body []byte) (string, error) {
	if s.signed == nil {
		return nonEmpty(s.cfg.ID(r, body))
	}
	if s.cfg.ID != nil {
		id, err := nonEmpty(s.cfg.ID(signedView(r, s.signedH), body))
		if err == nil {
			return id, nil
		}
		if s.idWarned.CompareAndSwap(false, true) {
			s.log.Warn("webhook: Config.ID cannot name the event from what the signature covers (the body and the signed headers); events it cannot name are named by the verifier's SignedID instead, so that a captured delivery sent again with other headers is a duplicate",
				"verifier", fmt.Sprintf("%T", s.signed), "err", err)
		}
	}
	return nonEmpty(s.signed.SignedID(r, body))
}

func nonEmpty(id string, err error) (string, error) {
	if err == nil && id == "" {
		err = errors.New("webhook: the event ID is empty")
	}
	return id, err
}

// signedView returns a shallow copy of r that holds, of r's headers, only
// those named in signed, and no query string.
func signedView(r *http.Request, signed []string) *http.Request {
	v := r.WithContext(r.Context())
	v.Header = make(http.Header, len(signed))
	for _, name := range signed {
		if vals, ok := r.Header[name]; ok {
			v.Header[name] = vals
		}
	}
	u := *r.URL
	u.RawQuery, u.ForceQuery = "", false
	v.URL = &u
	v.Form, v.PostForm, v.MultipartForm, v.Trailer = nil, nil, nil, nil
	return v
}
