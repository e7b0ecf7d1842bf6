package webhook

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/lanes"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

// ErrClosed is returned by Fetch after Close. It also matches
// consumer.ErrSourceDone, so that a consumer.Run reading the source returns
// once its batches in flight have settled.
var ErrClosed = fmt.Errorf("webhook: source closed: %w", consumer.ErrSourceDone)

// SourceName is Message.Source of the messages of a Source.
const SourceName = "webhook"

// Source is a consumer.Source fed by HTTP requests: mount it on a mux (it
// is an http.Handler) and run a consumer.Consumer on it. See the package
// documentation.
type Source struct {
	cfg      Config
	log      *slog.Logger
	lanes    *lanes.Lanes
	laneName []string // the default lanes' names
	tries    *attempts
	store    *attemptStore    // Config.DB's attempt counts, or nil
	headers  []string         // canonical names of Config.Headers
	signed   SignedIDVerifier // Config.Verifier, when it is one
	signedH  []string         // its SignedHeaders, canonical
	idWarned atomic.Bool      // the warning that Config.ID was replaced was logged

	mu       sync.Mutex
	closed   bool
	running  bool                   // a consumer is fetching (see noteFetchEnd)
	stopping bool                   // a Fetch ended with its context since the last began
	fetchers int                    // Fetch calls in progress
	inFlight int                    // batches fetched and not settled
	up       chan struct{}          // closed while running
	queued   map[*delivery]struct{} // verified requests not yet fetched
}

var (
	_ consumer.Source        = (*Source)(nil)
	_ consumer.HorizonSource = (*Source)(nil)
	_ dedupe.Migrator        = (*Source)(nil)
	_ http.Handler           = (*Source)(nil)
)

// delivery states.
const (
	stateQueued int32 = iota
	stateFetched
	stateDropped
)

// delivery is one request handed to the consumer, waiting for its answer.
type delivery struct {
	state  atomic.Int32
	id     string
	answer chan answer // receives exactly one answer once fetched or dropped
}

// answer is what a request is told.
type answer struct {
	status     int
	result     Result
	retryAfter time.Duration
	attempt    int // Message.Attempt, once the batch was fetched
	err        error
}

// New checks cfg and returns a Source. Requests are answered 503 until a
// consumer fetches from it (see WaitRunning); call Close when done.
func New(cfg Config) (*Source, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Source{
		cfg:    cfg,
		log:    cfg.Logger,
		lanes:  lanes.New(lanes.Config{AutoLanes: true, Buffer: cfg.MaxQueued}),
		tries:  newAttempts(cfg.MaxTracked),
		up:     make(chan struct{}),
		queued: map[*delivery]struct{}{},
	}
	if cfg.DB != nil {
		s.store = newAttemptStore(cfg)
	}
	if cfg.Lane == nil {
		s.laneName = make([]string, cfg.Lanes)
		for i := range s.laneName {
			s.laneName[i] = SourceName + "/" + strconv.Itoa(i)
		}
	}
	if cfg.Headers == nil {
		cfg.Headers = defaultHeaders
	}
	for _, h := range cfg.Headers {
		if h := http.CanonicalHeaderKey(h); !slices.Contains(s.headers, h) {
			s.headers = append(s.headers, h)
		}
	}
	if sv, ok := cfg.Verifier.(SignedIDVerifier); ok {
		s.signed = sv
		for _, h := range sv.SignedHeaders() {
			s.signedH = append(s.signedH, http.CanonicalHeaderKey(h))
		}
	}
	if _, ok := cfg.Verifier.(unverified); ok {
		s.log.Warn("webhook: requests are not verified (webhook.Unverified): anyone who can reach the endpoint can deliver events")
	}
	return s, nil
}

// writeAttempts stores the counts of a settled batch (Config.DB). A
// failure is logged: the counts of this process go on in memory.
func (s *Source) writeAttempts(ctx context.Context, ack []*consumer.Message, retry []consumer.Retry) {
	retried := make([]*consumer.Message, len(retry))
	for i, r := range retry {
		retried[i] = r.Message
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	if err := s.store.write(ctx, ack, retried); err != nil {
		s.log.Warn("webhook: attempt counts could not be stored; the failed events are counted by this process alone", "err", err)
	}
}

// Migrations returns the migration line of the attempts table when
// Config.DB is set (dedupe.Migrator), so that the consumer's Migrate
// creates it; none otherwise.
func (s *Source) Migrations() []pg.Line {
	if s.store == nil {
		return nil
	}
	return []pg.Line{s.store.line}
}

// RedeliveryHorizon returns Config.RedeliveryHorizon
// (consumer.HorizonSource).
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, error) {
	return s.cfg.RedeliveryHorizon, nil
}

// Running reports whether a consumer is fetching from the source, so that
// requests are handed to it rather than answered 503.
func (s *Source) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running && !s.closed
}

// WaitRunning waits until a consumer fetches from the source, or ctx is
// done, or the source is closed (ErrClosed).
func (s *Source) WaitRunning(ctx context.Context) error {
	s.mu.Lock()
	up, closed := s.up, s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	select {
	case <-up:
		if !s.Running() {
			return ErrClosed
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Fetch returns up to max verified requests of one lane that has no batch
// in flight, in arrival order, waiting for requests if there are none.
// Requests whose client went away before they were fetched are left out.
func (s *Source) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	s.noteFetchStart()
	for {
		b, err := s.lanes.Next(ctx, max)
		if err != nil {
			if errors.Is(err, lanes.ErrClosed) {
				err = ErrClosed
			}
			s.noteFetchEnd(ctx, false)
			return nil, err
		}
		kept := b.Messages[:0]
		for _, m := range b.Messages {
			if d := m.SourceData.(*delivery); d.state.CompareAndSwap(stateQueued, stateFetched) {
				kept = append(kept, m)
			}
		}
		clear(b.Messages[len(kept):])
		b.Messages = kept
		if len(kept) == 0 {
			s.lanes.Finish(b, false)
			continue
		}
		s.mu.Lock()
		for _, m := range kept {
			delete(s.queued, m.SourceData.(*delivery))
		}
		s.mu.Unlock()
		if s.store != nil {
			if err := s.store.load(ctx, kept); err != nil {
				s.log.Warn("webhook: stored attempt counts could not be read; this batch's deliveries are counted by this process alone", "lane", b.Lane, "err", err)
			}
		}
		b.SourceData = s
		s.noteFetchEnd(ctx, true)
		return b, nil
	}
}

// Settle answers the batch's requests: 200 for the acknowledged ones
// (applied, duplicate or parked, committed), 500 for the retried ones (the
// provider's redelivery is the retry), 503 for the abandoned ones. It
// returns nil, also for a batch settled already.
func (s *Source) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	if src, ok := b.SourceData.(*Source); !ok || src != s {
		return errors.New("webhook: Settle: batch did not come from this source")
	}
	if ok, _ := s.lanes.Finish(b, false); !ok {
		s.log.Debug("webhook: Settle of a batch that is no longer in flight ignored", "lane", b.Lane)
		return nil
	}
	acked := make(map[*consumer.Message]bool, len(ack))
	for _, m := range ack {
		acked[m] = true
	}
	retried := make(map[*consumer.Message]time.Duration, len(retry))
	for _, r := range retry {
		retried[r.Message] = r.Delay
	}
	if s.store != nil {
		s.writeAttempts(ctx, ack, retry)
	}
	for _, m := range b.Messages {
		d := m.SourceData.(*delivery)
		var a answer
		if acked[m] {
			a = answer{status: http.StatusOK, result: ResultAccepted, attempt: m.Attempt}
			if d.id != "" {
				s.tries.forget(d.id)
			}
		} else if delay, ok := retried[m]; ok {
			a = answer{status: http.StatusInternalServerError, result: ResultFailed, retryAfter: delay, attempt: m.Attempt,
				err: errors.New("webhook: the handler failed; the provider's redelivery is the retry")}
		} else {
			// Abandoned (the consumer stopped): no attempt was spent.
			if d.id != "" {
				s.tries.undo(d.id)
			}
			a = answer{status: http.StatusServiceUnavailable, result: ResultUnavailable,
				err: errors.New("webhook: the consumer stopped before the event's batch settled")}
		}
		d.answer <- a
	}
	s.mu.Lock()
	s.inFlight--
	s.maybeStopped()
	s.mu.Unlock()
	return nil
}

// Close stops taking requests: those waiting to be fetched and any that
// come later are answered 503, and Fetch returns ErrClosed. Batches in
// flight can still be settled, and their requests are answered. Close the
// source after the HTTP server has shut down and the consumer has
// stopped.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.dropQueued("webhook: the source was closed")
	s.lanes.Close()
	if s.running {
		s.running = false
	} else {
		close(s.up) // wake WaitRunning
	}
	return nil
}

func (s *Source) noteFetchStart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetchers++
	s.stopping = false
	if !s.running && !s.closed {
		s.running = true
		close(s.up)
	}
}

// noteFetchEnd records the end of a Fetch. A Fetch that ends because its
// context is done means its consumer is stopping (consumer.Consumer
// cancels it only then): once no Fetch is in progress and no batch in
// flight, the consumer is taken as stopped, and the requests waiting for
// it are answered 503.
func (s *Source) noteFetchEnd(ctx context.Context, gotBatch bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetchers--
	if gotBatch {
		s.inFlight++
	}
	if ctx.Err() != nil && !gotBatch {
		s.stopping = true
	}
	s.maybeStopped()
}

// maybeStopped marks the consumer stopped when it is. s.mu must be held.
func (s *Source) maybeStopped() {
	if !s.running || !s.stopping || s.fetchers > 0 || s.inFlight > 0 {
		return
	}
	s.running = false
	s.up = make(chan struct{})
	if s.closed {
		close(s.up)
	}
	s.dropQueued("webhook: the consumer stopped")
	s.log.Info("webhook: the consumer stopped fetching; requests are answered 503 until it fetches again")
}

// dropQueued answers 503 to every request not fetched yet. s.mu must be
// held. The dropped messages stay in their lanes until a Fetch skips them.
func (s *Source) dropQueued(why string) {
	for d := range s.queued {
		if d.state.CompareAndSwap(stateQueued, stateDropped) {
			if d.id != "" {
				s.tries.undo(d.id)
			}
			d.answer <- answer{status: http.StatusServiceUnavailable, result: ResultUnavailable, err: errors.New(why)}
		}
	}
	clear(s.queued)
}

// laneOf returns the lane of a request whose event ID is id.
func (s *Source) laneOf(r *http.Request, body []byte, id string) string {
	if s.cfg.Lane != nil {
		if l := s.cfg.Lane(r, body, id); l != "" {
			return l
		}
		return SourceName
	}
	if id == "" {
		id = BodyID(body) // repeats of one body share a lane
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	return s.laneName[h.Sum32()%uint32(len(s.laneName))]
}

// Stats is a snapshot of a Source's state.
type Stats struct {
	// Queued counts the verified requests waiting for the consumer to
	// fetch them.
	Queued int
	// InFlight counts the batches fetched and not yet settled.
	InFlight int
	// Tracked counts the events whose unacknowledged deliveries are
	// counted (see Config.MaxTracked).
	Tracked int
}

// Stats returns a snapshot of the source's state, for metrics.
func (s *Source) Stats() Stats {
	s.mu.Lock()
	st := Stats{Queued: len(s.queued), InFlight: s.inFlight}
	s.mu.Unlock()
	st.Tracked = s.tries.len()
	return st
}
