package sqs

import "sync/atomic"

// Stats counts what a Source did since it was made.
type Stats struct {
	// Received counts messages received.
	Received int64
	// Deleted counts acknowledged messages deleted; DeleteErrors those that
	// could not be, after DeleteRetries retried entries.
	Deleted, DeleteErrors, DeleteRetries int64
	// Retried counts messages handed back with a delay; Abandoned those left
	// to run out their visibility timeout; Released those received but
	// handed back unprocessed (at Close, or behind a retried FIFO message).
	Retried, Abandoned, Released int64
	// Renewed counts visibility renewals by the heartbeat; HeartbeatErrors
	// those that failed.
	Renewed, HeartbeatErrors int64
	// ReceiveErrors counts failed ReceiveMessage calls.
	ReceiveErrors int64
}

type counters struct {
	received, deleted, deleteErrors, deleteRetries atomic.Int64
	retried, abandoned, released                   atomic.Int64
	renewed, heartbeatErrors, receiveErrors        atomic.Int64
}

// Stats returns the source's counters.
func (s *Source) Stats() Stats {
	c := &s.stats
	return Stats{
		Received: c.received.Load(), Deleted: c.deleted.Load(), DeleteErrors: c.deleteErrors.Load(), DeleteRetries: c.deleteRetries.Load(),
		Retried: c.retried.Load(), Abandoned: c.abandoned.Load(), Released: c.released.Load(),
		Renewed: c.renewed.Load(), HeartbeatErrors: c.heartbeatErrors.Load(), ReceiveErrors: c.receiveErrors.Load(),
	}
}
