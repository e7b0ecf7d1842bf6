package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/lanes"
)

// Result is what became of a request, as Observe reports it.
type Result uint8

const (
	// ResultAccepted: the event's outcome committed (applied, duplicate or
	// parked); answered 200.
	ResultAccepted Result = iota + 1
	// ResultFailed: the handler failed and nothing of it committed;
	// answered 500, so that the provider delivers the event again.
	ResultFailed
	// ResultRejected: refused before it reached the consumer (a bad, stale
	// or missing signature, a body too large, a method other than POST);
	// answered 4xx. Nothing of it was kept.
	ResultRejected
	// ResultUnavailable: no consumer is fetching, the source is closed, or
	// the consumer stopped before the event's batch settled; answered 503.
	ResultUnavailable
	// ResultGone: the client went away before the request was fetched;
	// it was taken off the queue, never processed, and nothing answered.
	ResultGone
)

// String returns the result's lower-case name.
func (r Result) String() string {
	switch r {
	case ResultAccepted:
		return "accepted"
	case ResultFailed:
		return "failed"
	case ResultRejected:
		return "rejected"
	case ResultUnavailable:
		return "unavailable"
	case ResultGone:
		return "gone"
	}
	return "invalid"
}

// Delivery describes one request, for Config.Observe.
type Delivery struct {
	// Request is the HTTP request; its body has been read.
	Request *http.Request
	// ID is the event ID, empty when the request was refused before it was
	// derived or had none.
	ID string
	// Attempt is Message.Attempt of the request's message, 0 when it
	// never became one.
	Attempt int
	// Status is the HTTP status answered (0 for ResultGone).
	Status int
	// Result is what became of the request.
	Result Result
	// Err says why for every result but ResultAccepted.
	Err error
	// Duration is the time from the request's arrival to its answer.
	Duration time.Duration
}

// ErrTooLarge is the error of a request whose body is larger than
// Config.MaxBodyBytes.
var ErrTooLarge = errors.New("webhook: request body too large")

// ServeHTTP takes a provider's delivery: it verifies the signature, hands
// the event to the consumer and answers once the event's batch settled.
// See the package documentation for the status codes.
func (s *Source) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	d := Delivery{Request: r}
	done := func(status int, res Result, retryAfter time.Duration, err error) {
		d.Status, d.Result, d.Err, d.Duration = status, res, err, time.Since(start)
		if s.cfg.Observe != nil {
			s.cfg.Observe(d)
		}
		if res == ResultGone {
			return
		}
		reply(w, status, retryAfter, err)
	}
	reject := func(status int, err error) {
		s.log.Warn("webhook: request rejected", "status", status, "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
		done(status, ResultRejected, 0, err)
	}

	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reject(http.StatusMethodNotAllowed, fmt.Errorf("webhook: method %s, want POST", r.Method))
		return
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		reject(http.StatusRequestEntityTooLarge, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, r.ContentLength, s.cfg.MaxBodyBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			reject(http.StatusRequestEntityTooLarge, fmt.Errorf("%w: limit %d", ErrTooLarge, s.cfg.MaxBodyBytes))
			return
		}
		err = fmt.Errorf("webhook: read body: %w", err)
		if r.Context().Err() != nil {
			done(0, ResultGone, 0, err)
		} else {
			reject(http.StatusBadRequest, err)
		}
		return
	}
	if err := s.cfg.Verifier.Verify(r, body); err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, ErrMalformedSignature) {
			status = http.StatusBadRequest
		}
		reject(status, err)
		return
	}
	if !s.Running() {
		done(http.StatusServiceUnavailable, ResultUnavailable, time.Second, errors.New("webhook: no consumer is fetching from the source"))
		return
	}

	id, err := s.eventID(r, body)
	if err != nil {
		// Handed on without an ID: the consumer's default KeyFunc finds no
		// key and parks it (invalid_key), so nothing is lost and the
		// provider stops.
		s.log.Warn("webhook: no event ID; handed to the consumer without one, to be parked as invalid_key under a hash of its body", "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
		id = ""
	}
	d.ID = id
	lane := s.laneOf(r, body, id)
	kept := &consumer.Message{Value: body, Time: start, Source: SourceName, Lane: lane, ID: id}
	if id != "" {
		// Every delivery of the event is the same message: the provider's
		// redelivery is its retry.
		kept.Ref = id
		kept.Headers = s.copyHeaders(r.Header)
	} else {
		// Parked as invalid_key. The same body signed is the same message,
		// however often it comes and whatever unsigned headers it brings:
		// named by the body, without headers, it is folded into one parked
		// row, so that a captured delivery cannot fill the parked table.
		kept.Ref = BodyID(body)
	}
	if err := s.redact(kept); err != nil {
		s.log.Error("webhook: Config.Redact panicked; the request is answered 500 and nothing of it is kept", "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
		done(http.StatusInternalServerError, ResultFailed, 0, err)
		return
	}

	dl, attempt, err := s.enqueue(r, kept)
	d.Attempt = attempt
	if err != nil {
		if r.Context().Err() != nil {
			done(0, ResultGone, 0, err)
		} else {
			done(http.StatusServiceUnavailable, ResultUnavailable, time.Second, err)
		}
		return
	}
	select {
	case a := <-dl.answer:
		if a.attempt > 0 {
			d.Attempt = a.attempt
		}
		done(a.status, a.result, a.retryAfter, a.err)
		return
	case <-r.Context().Done():
	}
	// The client went away. Not fetched yet: take it off the queue, as if
	// it had never come (the provider delivers it again).
	if dl.state.CompareAndSwap(stateQueued, stateDropped) {
		s.mu.Lock()
		delete(s.queued, dl)
		s.mu.Unlock()
		if id != "" {
			s.tries.undo(id)
		}
		done(0, ResultGone, 0, fmt.Errorf("webhook: the client went away before the event was processed: %w", context.Cause(r.Context())))
		return
	}
	// Fetched: its outcome is coming; wait for it, to report it.
	a := <-dl.answer
	if a.attempt > 0 {
		d.Attempt = a.attempt
	}
	done(a.status, a.result, a.retryAfter, a.err)
}

// enqueue files the request's message under its lane and returns the
// delivery to wait on, with the message's attempt number.
func (s *Source) enqueue(r *http.Request, m *consumer.Message) (*delivery, int, error) {
	lane, id := m.Lane, m.ID
	n, err := s.lanes.Reserve(r.Context(), lane, 1)
	if err != nil {
		if errors.Is(err, lanes.ErrClosed) {
			err = ErrClosed
		}
		return nil, 0, err
	}
	defer s.lanes.Unreserve(lane, n)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, 0, ErrClosed
	}
	if !s.running {
		return nil, 0, errors.New("webhook: no consumer is fetching from the source")
	}
	attempt := 1
	if id != "" {
		attempt = s.tries.next(id)
	}
	dl := &delivery{id: id, answer: make(chan answer, 1)}
	m.Attempt = attempt
	m.SourceData = dl
	if !s.lanes.Add(lane, m) {
		if id != "" {
			s.tries.undo(id)
		}
		return nil, attempt, ErrClosed
	}
	s.queued[dl] = struct{}{}
	return dl, attempt, nil
}

// reply writes a short plain-text answer.
func reply(w http.ResponseWriter, status int, retryAfter time.Duration, err error) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	if status >= 500 && retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((retryAfter+time.Second-1)/time.Second), 10))
	}
	w.WriteHeader(status)
	msg := http.StatusText(status)
	if err != nil && status != http.StatusUnauthorized && status >= 400 && status < 500 {
		// Say what was wrong with the request, but nothing of why a
		// signature did not match.
		msg += ": " + err.Error()
	}
	_, _ = io.WriteString(w, msg+"\n")
}
