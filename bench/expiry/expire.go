package expiry

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/idset"
)

// expire removes the markers of closed slice j (Slices is the oldest)
// through the strategy's own code and measures the wall time and the WAL
// written meanwhile. With checkpoint, a CHECKPOINT runs first, so that
// every expiry starts from the same state of full-page writes.
func (r *runner) expire(ctx context.Context, pool *pgxpool.Pool, c *claimer, j int, checkpoint bool) (Expiry, error) {
	if checkpoint {
		if err := exec(ctx, pool, `CHECKPOINT`); err != nil {
			return Expiry{}, err
		}
	}
	lo, hi := r.sliceRange(j)
	want := int64(hi - lo + 1)
	var (
		e   Expiry
		run func() (int64, error)
	)
	switch c {
	case r.bloom:
		run = func() (int64, error) { return r.dropSlice(ctx, pool, j, want) }
	case r.idset:
		// A Retention that ends half an hour before slice j-1 begins: slice
		// j's markers are at least an hour older than that (they are spread
		// over the first 23 hours of their day), slice j-1's are younger.
		var now time.Time
		if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return e, err
		}
		retention := now.Sub(r.sliceStart(j-1)) + 30*time.Minute
		sweeper, err := idset.New(idset.Config{Schema: r.cfg.Schema, Retention: retention})
		if err != nil {
			return e, err
		}
		run = func() (int64, error) { return sweeper.Sweep(ctx, pool) }
	}
	before, err := walLSN(ctx, pool)
	if err != nil {
		return e, err
	}
	begin := time.Now()
	e.Removed, err = run()
	e.Took = time.Since(begin)
	if err != nil {
		return e, fmt.Errorf("expiry: %s: expiring slice %d: %w", c.name, j, err)
	}
	if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint`, before).Scan(&e.WALBytes); err != nil {
		return e, err
	}
	if e.Removed != want {
		return e, fmt.Errorf("expiry: %s removed %d markers expiring slice %d, want %d", c.name, e.Removed, j, want)
	}
	r.cfg.Logf("%s: expired slice %d (%d markers) in %v, %d bytes of WAL", c.name, j, e.Removed, e.Took.Round(time.Microsecond), e.WALBytes)
	return e, nil
}

// dropSlice expires closed slice j of the bloom table by running Maintain
// on a second Strategy over the same table, whose Retention is j-1 slices:
// to it, the clock is as late as it will be when slice j expires under
// the Slices-slice retention, so it detaches and drops that partition
// (and only that one) as RunMaintenance will. It returns the number of
// markers the partition held.
func (r *runner) dropSlice(ctx context.Context, pool *pgxpool.Pool, j int, markers int64) (int64, error) {
	s, err := bloom.New(bloom.Config{
		Schema:        r.cfg.Schema,
		Slice:         slice,
		Retention:     time.Duration(j-1) * slice,
		DisableFilter: true, // this instance only maintains; it never claims
	})
	if err != nil {
		return 0, err
	}
	if err := s.Maintain(ctx, pool); err != nil {
		return 0, err
	}
	if n := s.Stats().Dropped; n != 1 {
		return 0, fmt.Errorf("dropped %d partitions, want 1", n)
	}
	name := pgx.Identifier{r.cfg.Schema, bloom.DefaultTable + "_" + r.sliceStart(j).Format("20060102t150405")}.Sanitize()
	var gone bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, name).Scan(&gone); err != nil {
		return 0, err
	}
	if !gone {
		return 0, fmt.Errorf("partition %s still exists", name)
	}
	return markers, nil
}

func walLSN(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var lsn string
	err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// concurrent runs c's claim loop for Steady, then expires slice j in
// another goroutine while the loop goes on, and compares the loop's rate
// over the expiry (at least MinWindow from its start) with its steady
// state: its rate over the Steady before the expiry and the Steady after
// the window, together, so that a drift in the machine's load affects
// both sides alike.
func (r *runner) concurrent(ctx context.Context, pool *pgxpool.Pool, c *claimer, j int) (Concurrent, error) {
	var out Concurrent
	if err := exec(ctx, pool, `CHECKPOINT`); err != nil {
		return out, err
	}
	stop := make(chan struct{})
	done := make(chan loopResult, 1)
	start := time.Now()
	go c.loop(ctx, pool, stop, done)
	halt := func() loopResult {
		close(stop)
		return <-done
	}
	wait := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case l := <-done:
			return fmt.Errorf("expiry: %s claim loop stopped: %w", c.name, l.err)
		}
	}
	if err := wait(r.cfg.Steady); err != nil {
		return out, err
	}
	t0 := time.Now()
	type expired struct {
		e   Expiry
		err error
	}
	ech := make(chan expired, 1)
	go func() {
		e, err := r.expire(ctx, pool, c, j, false)
		ech <- expired{e, err}
	}()
	ex := <-ech
	if ex.err != nil {
		halt()
		return out, ex.err
	}
	out.Expiry = ex.e
	out.Window = max(ex.e.Took, r.cfg.MinWindow)
	t1 := t0.Add(out.Window)
	if err := wait(time.Until(t1.Add(r.cfg.Steady))); err != nil {
		return out, err
	}
	l := halt()
	if l.err != nil {
		return out, l.err
	}
	before, worstBefore, n1 := l.window(start, t0)
	after, worstAfter, n2 := l.window(t1, t1.Add(r.cfg.Steady))
	out.Steady = (before*t0.Sub(start).Seconds() + after*r.cfg.Steady.Seconds()) / (t0.Sub(start) + r.cfg.Steady).Seconds()
	out.SteadyWorst, out.SteadyClaims = max(worstBefore, worstAfter), n1+n2
	out.During, out.DuringWorst, _ = l.window(t0, t1)
	r.cfg.Logf("%s: %.0f keys/s before, %.0f keys/s after, %.0f keys/s over %v of expiry (%.0f%% of steady)", c.name, before, after, out.During,
		out.Window.Round(time.Millisecond), 100*out.Ratio())
	return out, nil
}
