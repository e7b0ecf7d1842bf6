package outbox

import (
	"context"
	"fmt"
	"time"
)

// lease is a partition this relay holds: the generation it took it with,
// and until when it may publish for it, by its own clock.
type lease struct {
	gen      int64
	deadline time.Time
}

// tickLeases heartbeats the relay, renews its leases, gives back those over
// its share and takes free ones up to it. A lease's deadline is measured
// from before the statement that set it was sent, less the margin, so it
// ends before the database's expiry does.
func (r *Relay) tickLeases(ctx context.Context) error {
	t := r.t
	ttl := r.cfg.LeaseTTL
	start := r.now()
	deadline := start.Add(ttl - r.cfg.LeaseMargin)
	if _, err := r.db.Exec(ctx, `INSERT INTO `+t.relays+` (owner, expires_at) VALUES ($1, now() + $2::interval)
ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at`, r.owner, ttl); err != nil {
		return fmt.Errorf("outbox: relay heartbeat: %w", err)
	}
	var live int
	if err := r.db.QueryRow(ctx, `SELECT count(*) FROM `+t.relays+` WHERE expires_at > now()`).Scan(&live); err != nil {
		return fmt.Errorf("outbox: relay heartbeat: %w", err)
	}
	share := (Partitions + max(live, 1) - 1) / max(live, 1)

	parts, gens := r.held()
	renewed := map[int32]lease{}
	rows, err := r.db.Query(ctx, `UPDATE `+t.leases+` l SET expires_at = now() + $3::interval
FROM unnest($1::int[], $2::bigint[]) AS h(part, gen)
WHERE l.part = h.part AND l.generation = h.gen AND l.owner = $4
RETURNING l.part, l.generation`, parts, gens, ttl, r.owner)
	if err != nil {
		return fmt.Errorf("outbox: renew leases: %w", err)
	}
	for rows.Next() {
		var p int32
		var g int64
		if err := rows.Scan(&p, &g); err != nil {
			rows.Close()
			return fmt.Errorf("outbox: renew leases: %w", err)
		}
		renewed[p] = lease{gen: g, deadline: deadline}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: renew leases: %w", err)
	}
	lost := len(parts) - len(renewed)

	released := 0
	if extra := len(renewed) - share; extra > 0 {
		var give []int32
		var giveGens []int64
		for p, l := range renewed {
			if len(give) == extra {
				break
			}
			give = append(give, p)
			giveGens = append(giveGens, l.gen)
			delete(renewed, p)
		}
		if err := r.release(ctx, give, giveGens); err != nil {
			return err
		}
		released = len(give)
	}
	taken := 0
	if want := share - len(renewed); want > 0 {
		rows, err := r.db.Query(ctx, `UPDATE `+t.leases+` l
SET owner = $1, generation = l.generation + 1, expires_at = now() + $2::interval
WHERE l.part IN (SELECT part FROM `+t.leases+` WHERE expires_at < now() ORDER BY random() LIMIT $3 FOR UPDATE SKIP LOCKED)
RETURNING l.part, l.generation`, r.owner, ttl, want)
		if err != nil {
			return fmt.Errorf("outbox: take leases: %w", err)
		}
		for rows.Next() {
			var p int32
			var g int64
			if err := rows.Scan(&p, &g); err != nil {
				rows.Close()
				return fmt.Errorf("outbox: take leases: %w", err)
			}
			renewed[p] = lease{gen: g, deadline: deadline}
			taken++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("outbox: take leases: %w", err)
		}
	}
	r.mu.Lock()
	r.leases = renewed
	r.mu.Unlock()
	r.leasesChanged(ctx, LeaseEvent{Acquired: taken, Lost: lost, Released: released, Held: len(renewed), Relays: live})
	if lost > 0 || taken > 0 {
		r.log.Debug("outbox: leases changed", "owner", r.owner, "held", len(renewed), "taken", taken, "lost", lost, "relays", live)
	}
	return nil
}

// held returns the partitions held and their generations.
func (r *Relay) held() ([]int32, []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	parts := make([]int32, 0, len(r.leases))
	gens := make([]int64, 0, len(r.leases))
	for p, l := range r.leases {
		parts = append(parts, p)
		gens = append(gens, l.gen)
	}
	return parts, gens
}

// valid returns the deadline of the lease on part, and whether it is held
// with generation gen and not past its deadline by the relay's clock.
func (r *Relay) valid(part int32, gen int64) (time.Time, bool) {
	r.mu.Lock()
	l, ok := r.leases[part]
	r.mu.Unlock()
	return l.deadline, ok && l.gen == gen && r.now().Before(l.deadline)
}

// release gives partitions back, free at once.
func (r *Relay) release(ctx context.Context, parts []int32, gens []int64) error {
	if len(parts) == 0 {
		return nil
	}
	_, err := r.db.Exec(ctx, `UPDATE `+r.t.leases+` l SET expires_at = '-infinity'
FROM unnest($1::int[], $2::bigint[]) AS h(part, gen)
WHERE l.part = h.part AND l.generation = h.gen AND l.owner = $3`, parts, gens, r.owner)
	if err != nil {
		return fmt.Errorf("outbox: release leases: %w", err)
	}
	return nil
}
