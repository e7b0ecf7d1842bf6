package idempotency

import (
	"context"
	"net/http"
	"strings"
)

// Request describes, to Config.Hooks, the HTTP request a batch of one
// stands for, so that a tracing hook can make an HTTP server span of it
// (tracing/effotel does). RequestOf finds it in the context the hooks
// receive; Status and Replayed are set before BatchDone is called.
type Request struct {
	// Method is the request's method.
	Method string
	// Route is the path pattern of the net/http.ServeMux route that matched
	// (its Pattern without method and host, "/payments/{id}"), or empty
	// when the handler was not reached through a pattern.
	Route string
	// Path is the request's URL path.
	Path string
	// Status is the status code answered.
	Status int
	// Replayed is true when the answer was a stored response.
	Replayed bool
}

type requestKey struct{}

// RequestOf returns the Request of a middleware's batch, from the context
// Config.Hooks receive in BatchStart and BatchDone, or nil.
func RequestOf(ctx context.Context) *Request {
	r, _ := ctx.Value(requestKey{}).(*Request)
	return r
}

// newRequestInfo returns the Request of r, and r's context carrying it.
func newRequestInfo(r *http.Request) (*Request, context.Context) {
	info := &Request{Method: r.Method, Path: r.URL.Path, Route: route(r.Pattern)}
	return info, context.WithValue(r.Context(), requestKey{}, info)
}

// route returns the path of a ServeMux pattern ("[METHOD ][HOST]/PATH").
func route(pattern string) string {
	if _, rest, ok := strings.Cut(pattern, " "); ok {
		pattern = strings.TrimLeft(rest, " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		pattern = pattern[i:]
	}
	return pattern
}

// statusWriter records the status a response was sent with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}
