package logx

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Persisting logs a failure that is harmless once (retried on the next
// tick) but not when it goes on: at Debug while it lasts less than After,
// then at Warn, once per After, with how long it has lasted. A success
// ends the run of failures. The zero value warns after 30 seconds.
type Persisting struct {
	After time.Duration // 30s when zero

	mu     sync.Mutex
	since  time.Time // first failure of the current run; zero after a success
	warned time.Time // last Warn of the current run
}

// Failed logs msg with args and err: at Debug, or at Warn (with
// "failing_for") once the failures have lasted After.
func (p *Persisting) Failed(log *slog.Logger, msg string, err error, args ...any) {
	now := time.Now()
	p.mu.Lock()
	if p.since.IsZero() {
		p.since = now
	}
	after := p.After
	if after <= 0 {
		after = 30 * time.Second
	}
	lasted := now.Sub(p.since)
	warn := lasted >= after && now.Sub(p.warned) >= after
	if warn {
		p.warned = now
	}
	p.mu.Unlock()
	args = append(args, "err", err)
	if !warn {
		log.Debug(msg, args...)
		return
	}
	log.Log(context.Background(), slog.LevelWarn, msg, append(args, "failing_for", lasted.Round(time.Second))...)
}

// Succeeded ends the current run of failures.
func (p *Persisting) Succeeded() {
	p.mu.Lock()
	p.since, p.warned = time.Time{}, time.Time{}
	p.mu.Unlock()
}

// KafkaCommitFailed is the log message of a failed offset commit to Kafka
// by the Kafka source named prefix ("kafka", "franz"), saying what the failure
// means for a source with its offsets in PostgreSQL, or in Kafka only.
func KafkaCommitFailed(prefix string, kafkaOffsetsOnly bool) string {
	if kafkaOffsetsOnly {
		return prefix + ": committing offsets to Kafka failed; retrying every second (with KafkaOffsetsOnly these are the group's positions: " +
			"a rebalance or restart now delivers again what was consumed since the last commit, recognised as duplicates)"
	}
	return prefix + ": committing offsets to Kafka failed; retrying every second (the positions in PostgreSQL are not affected: " +
		"tools and lag monitors that read Kafka's committed offsets see them behind until a commit succeeds)"
}
