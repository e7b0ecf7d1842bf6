package chaostest

import (
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/effectively-once/effectively/integration/chaos"
	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
)

// The chaos events: what the driver does to the group.

// kill SIGKILLs a random live worker and starts a replacement in its slot
// (with static membership, under its instance ID).
func (r *run) kill() {
	i := r.rng.IntN(len(r.live))
	p := r.live[i]
	r.live = append(r.live[:i], r.live[i+1:]...)
	r.events = append(r.events, event{kind: "kill", detail: p.name, at: time.Now()})
	p.kill()
	slot := r.slotOf[p]
	delete(r.slotOf, p)
	time.Sleep(time.Duration(r.rng.IntN(1000)) * time.Millisecond) // not a wait for an event: a random delay
	n := r.startWorker(slot)
	r.events[len(r.events)-1].detail += ", replaced by " + n.name
}

// freeze SIGSTOPs a random live worker in the middle of a transaction
// that has written (its markers or its offset), for freezeFor, then
// SIGCONTs it. A frozen process cannot end its transaction, so the
// partition's next owner meets its locks.
func (r *run) freeze() {
	p := r.live[r.rng.IntN(len(r.live))]
	inTx := r.stopInTransaction(p)
	d := freezeFor(timing)
	detail := fmt.Sprintf("%s for %s", p.name, d)
	if !inTx {
		detail += " (between transactions)"
	}
	r.events = append(r.events, event{kind: "freeze", detail: detail, at: time.Now(), noTx: !inTx})
	timer := time.NewTimer(d)
	defer timer.Stop()
	// Halfway through, the session expired and the partitions' new owners
	// should be at work: say what, if anything, waits for the frozen one.
	half := time.NewTimer(d / 2)
	defer half.Stop()
	select {
	case <-half.C:
		r.logLockWaits(p)
	case <-r.ctx.Done():
	}
	select {
	case <-timer.C:
	case <-r.ctx.Done():
	}
	if err := p.signal(syscall.SIGCONT); err != nil {
		r.t.Fatalf("SIGCONT %s: %v", p.name, err)
	}
	r.events = append(r.events, event{kind: "thaw", detail: p.name, at: time.Now()})
}

// logLockWaits logs the statements of other workers that wait for a lock
// held by frozen's connections.
func (r *run) logLockWaits(frozen *proc) {
	rows, err := r.pool.Query(r.ctx, `SELECT w.application_name, left(regexp_replace(w.query, '\s+', ' ', 'g'), 120), now() - w.query_start
FROM pg_stat_activity w
JOIN pg_stat_activity h ON h.pid = ANY (pg_blocking_pids(w.pid))
WHERE h.application_name = $1`, chaos.ApplicationName(frozen.name))
	if err != nil {
		r.t.Logf("lock waits: %v", err)
		return
	}
	var (
		app, query string
		waited     time.Duration
		lines      []string
	)
	_, err = pgx.ForEachRow(rows, []any{&app, &query, &waited}, func() error {
		lines = append(lines, fmt.Sprintf("%s waits %s in: %s", app, waited.Round(100*time.Millisecond), query))
		return nil
	})
	if err != nil {
		r.t.Logf("lock waits: %v", err)
		return
	}
	if len(lines) > 0 {
		r.t.Logf("%s is frozen, and %d statements wait for its locks:\n  %s", frozen.name, len(lines), strings.Join(lines, "\n  "))
		if r.lockWaits == nil {
			r.lockWaits = map[int][]string{}
		}
		r.lockWaits[len(r.events)-1] = lines
	}
}

// stopInTransaction SIGSTOPs p in the middle of a batch transaction: it
// watches pg_stat_activity for a transaction of p's that has written
// something (it has a transaction ID), stops the process, and checks a
// moment later that one of p's transactions that has written sits idle in
// transaction, that is, waits for the stopped process. A statement still
// running on the server at the stop does not count: it ends on its own.
// If the check fails it lets the process go on and tries again. After 20s
// of trying it stops the process wherever it is and returns false.
func (r *run) stopInTransaction(p *proc) bool {
	const (
		writing = `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND backend_xid IS NOT NULL`
		held    = writing + ` AND state = 'idle in transaction'`
	)
	app := chaos.ApplicationName(p.name)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && r.ctx.Err() == nil {
		var n int
		if err := r.pool.QueryRow(r.ctx, writing, app).Scan(&n); err != nil || n == 0 {
			time.Sleep(5 * time.Millisecond) // polling pg_stat_activity, not waiting for an event
			continue
		}
		if err := p.signal(syscall.SIGSTOP); err != nil {
			r.t.Fatalf("SIGSTOP %s: %v", p.name, err)
		}
		time.Sleep(100 * time.Millisecond) // let a statement in progress finish on the server
		if err := r.pool.QueryRow(r.ctx, held, app).Scan(&n); err == nil && n > 0 {
			return true
		}
		if err := p.signal(syscall.SIGCONT); err != nil {
			r.t.Fatalf("SIGCONT %s: %v", p.name, err)
		}
		time.Sleep(time.Duration(r.rng.IntN(50)) * time.Millisecond)
	}
	if err := p.signal(syscall.SIGSTOP); err != nil {
		r.t.Fatalf("SIGSTOP %s: %v", p.name, err)
	}
	return false
}

// newTopic creates the topic the workers were configured with from the
// start, and produces to it from now on.
func (r *run) newTopic() {
	r.createTopic(topicNew, partsNew)
	r.newTopicAt = time.Now()
	for p := range partsNew {
		r.newLanes = append(r.newLanes, laneKey{topicNew, int32(p)})
	}
	r.prod.addLanes(r.newLanes...)
	r.events = append(r.events, event{kind: "new-topic", detail: fmt.Sprintf("%s with %d partitions", topicNew, partsNew), at: r.newTopicAt})
}

// addPartitions grows topicA and produces to the new partitions too.
func (r *run) addPartitions() {
	resp, err := r.admin.CreatePartitions(r.ctx, &kafkago.CreatePartitionsRequest{
		Topics: []kafkago.TopicPartitionsConfig{{Name: topicA, Count: partsAAfter}},
	})
	if err == nil {
		err = resp.Errors[topicA]
	}
	if err != nil {
		r.t.Fatalf("add partitions to %s: %v", topicA, err)
	}
	r.addedAt = time.Now()
	for p := partsA; p < partsAAfter; p++ {
		r.addLanes = append(r.addLanes, laneKey{topicA, int32(p)})
	}
	r.prod.addLanes(r.addLanes...)
	r.events = append(r.events, event{kind: "add-partitions", detail: fmt.Sprintf("%s from %d to %d", topicA, partsA, partsAAfter), at: r.addedAt})
}
