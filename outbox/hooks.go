package outbox

import (
	"context"
	"time"
)

// SinkPass is what one publish pass did for one sink.
type SinkPass struct {
	// Sink is the sink's name.
	Sink string
	// Published, Retried and Parked count the messages published, failed
	// transiently (to be tried again after a backoff) and refused for good
	// (parked). Held counts those given no outcome: behind a failure of
	// their key in the same pass, or failed while the relay was shutting
	// down or past its lease. They stay as they were and come back later.
	Published, Retried, Parked, Held int
	// Publish is the time the sink took, isolating refused messages
	// included.
	Publish time.Duration
	// CommitToPublish holds, for each published message, the time from its
	// row's created_at (the emitting transaction's start, by the database's
	// clock) to the end of its publish (by the relay's clock). It is filled
	// only when the relay has hooks.
	CommitToPublish []time.Duration
}

// PassStats describes one publish pass: a batch read and published.
// Passes that read nothing are not reported.
type PassStats struct {
	// Owner is the relay's RelayConfig.Owner.
	Owner string
	// Read is the number of rows the pass read; Expired those skipped
	// because their lease was past its deadline by the relay's clock.
	Read, Expired int
	// Sinks has one entry per sink the pass published to, in the order
	// they were published.
	Sinks []SinkPass
	// Marked is the number of outcomes written back; fewer than the
	// outcomes when a lease was lost during the pass (another relay
	// publishes those rows again).
	Marked int64
	// Err is the error that ended the pass early, if any.
	Err error
	// Total is the time the pass took, from the fetch to the marking.
	Total time.Duration
}

// Counts returns the sums over the sinks of the pass.
func (s *PassStats) Counts() (published, retried, parked, held int) {
	for _, p := range s.Sinks {
		published += p.Published
		retried += p.Retried
		parked += p.Parked
		held += p.Held
	}
	return
}

// RelayHook observes a relay, for metrics and tracing. Hooks run on the
// relay's goroutine and should return quickly. A RelayHook may implement
// WakeHook, LeaseHook and BacklogHook too; they are resolved once in
// NewRelay.
type RelayHook interface {
	// PassDone is called after each publish pass that read rows.
	PassDone(ctx context.Context, s *PassStats)
}

// WakeKind says what woke a relay up.
type WakeKind uint8

const (
	// WakeNotify: a NOTIFY from an emitting transaction.
	WakeNotify WakeKind = iota + 1
	// WakePoll: the poll interval ran out (or the wait for the lease
	// renewal, or the backoff after a failed pass).
	WakePoll
)

// String returns the kind's lower-case name.
func (k WakeKind) String() string {
	switch k {
	case WakeNotify:
		return "notify"
	case WakePoll:
		return "poll"
	}
	return "invalid"
}

// WakeHook is an optional RelayHook extension called when the relay wakes
// from waiting for work. Passes run straight after a full batch are not
// wake-ups.
type WakeHook interface {
	Woke(ctx context.Context, owner string, kind WakeKind)
}

// LeaseEvent describes a change in the partitions a relay holds.
type LeaseEvent struct {
	// Owner is the relay's RelayConfig.Owner.
	Owner string
	// Acquired, Lost and Released count the partitions taken, found taken
	// by another relay (or expired) at renewal, and given back (over the
	// relay's share, or at shutdown).
	Acquired, Lost, Released int
	// Held is the number of partitions held after the change.
	Held int
	// Relays is the number of live relays the share was computed from; 0
	// at shutdown.
	Relays int
}

// LeaseHook is an optional RelayHook extension called when the relay's
// leases change.
type LeaseHook interface {
	LeasesChanged(ctx context.Context, e LeaseEvent)
}

// Backlog is what waits in the outbox for one sink: unpublished rows, not
// parked (parked rows wait for a redrive, not for a relay).
type Backlog struct {
	Sink string
	// Waiting is the number of rows.
	Waiting int64
	// Oldest is the age of the oldest, by the database's clock, from its
	// created_at.
	Oldest time.Duration
}

// BacklogHook is an optional RelayHook extension called every
// RelayConfig.BacklogInterval with the whole outbox's backlog (every
// partition, not only the relay's), one entry per sink with rows waiting.
// Every running relay reports it; the figures are the same.
type BacklogHook interface {
	Backlog(ctx context.Context, owner string, b []Backlog)
}

// hooks are the relay's hooks, resolved once.
type hooks struct {
	pass    []RelayHook
	wake    []WakeHook
	lease   []LeaseHook
	backlog []BacklogHook
}

func newHooks(hs []RelayHook) hooks {
	var h hooks
	for _, x := range hs {
		if x == nil {
			continue
		}
		h.pass = append(h.pass, x)
		if w, ok := x.(WakeHook); ok {
			h.wake = append(h.wake, w)
		}
		if l, ok := x.(LeaseHook); ok {
			h.lease = append(h.lease, l)
		}
		if b, ok := x.(BacklogHook); ok {
			h.backlog = append(h.backlog, b)
		}
	}
	return h
}

func (r *Relay) passDone(ctx context.Context, s *PassStats) {
	for _, h := range r.hooks.pass {
		h.PassDone(ctx, s)
	}
}

func (r *Relay) woke(ctx context.Context, kind WakeKind) {
	for _, h := range r.hooks.wake {
		h.Woke(ctx, r.owner, kind)
	}
}

func (r *Relay) leasesChanged(ctx context.Context, e LeaseEvent) {
	if e.Acquired == 0 && e.Lost == 0 && e.Released == 0 {
		return
	}
	e.Owner = r.owner
	for _, h := range r.hooks.lease {
		h.LeasesChanged(ctx, e)
	}
}

// reportBacklog reads the backlog and hands it to the backlog hooks.
func (r *Relay) reportBacklog(ctx context.Context) error {
	b, err := r.backlog(ctx)
	if err != nil {
		return err
	}
	for _, h := range r.hooks.backlog {
		h.Backlog(ctx, r.owner, b)
	}
	return nil
}
