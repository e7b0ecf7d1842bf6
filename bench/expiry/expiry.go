package expiry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
)

// slice is the length of one retention slice: a day, so that a run never
// waits for a boundary and rarely meets one.
const slice = 24 * time.Hour

// idsetTable is idset's markers table.
const idsetTable = idset.DefaultTable

// Config sizes a run. The zero value is the full benchmark.
type Config struct {
	// Schema holds both strategies' tables and their migrations; Run drops
	// and recreates it. Defaults to "expiry_bench".
	Schema string
	// Markers is the number of live markers loaded into each strategy's
	// table before measuring. Defaults to 10,000,000.
	Markers int
	// Slices is the retention in slices (of a day each); the markers are
	// spread evenly over that many closed slices. At least 3. Defaults to 7.
	Slices int
	// Batch is the number of new keys per claiming transaction. Defaults
	// to 500.
	Batch int
	// ClaimKeys is the number of new keys each strategy claims per
	// throughput run. Defaults to 100,000.
	ClaimKeys int
	// Runs is the number of interleaved throughput runs; the median is
	// reported. Defaults to 7.
	Runs int
	// Steady is how long the claim loop runs before an expiry starts and
	// after its window ends; its rate over those two spans is the steady
	// state. Defaults to 3 seconds.
	Steady time.Duration
	// Drops is how many slices bloom drops under claims (the median
	// ratio is reported): a drop lasts a fraction of MinWindow, so a
	// single window on a shared machine is noisy. idset's sweep, which
	// lasts many windows, runs once. At most Slices-2. Defaults to 3.
	Drops int
	// MinWindow is the shortest window over which the throughput during an
	// expiry is measured, from the expiry's start: an expiry shorter than
	// that is measured with the claims that follow it. Defaults to 1 second.
	MinWindow time.Duration
	// CurrentKeys sizes bloom's filter of the current slice
	// (bloom.Config.ExpectedKeysPerSlice) for the traffic a user would
	// size it for: the new keys the run claims, all into the current
	// slice. An undersized filter answers "maybe" for most new keys and
	// sends them to a probe of the current partition. The loaded slices'
	// sealed filters are sized from the store, whatever this is. Defaults
	// to 2 × Runs × ClaimKeys, about what the throughput and expiry
	// phases claim (Run logs the count).
	CurrentKeys int
	// Logf receives progress lines. Defaults to discarding them.
	Logf func(format string, args ...any)
}

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = "expiry_bench"
	}
	if c.Markers == 0 {
		c.Markers = 10_000_000
	}
	if c.Slices == 0 {
		c.Slices = 7
	}
	if c.Batch == 0 {
		c.Batch = 500
	}
	if c.ClaimKeys == 0 {
		c.ClaimKeys = 100_000
	}
	if c.Runs == 0 {
		c.Runs = 7
	}
	if c.Steady == 0 {
		c.Steady = 3 * time.Second
	}
	if c.Drops == 0 {
		c.Drops = min(3, c.Slices-2)
	}
	if c.MinWindow == 0 {
		c.MinWindow = time.Second
	}
	if c.CurrentKeys == 0 {
		c.CurrentKeys = 2 * c.Runs * c.ClaimKeys
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Slices < 3:
		return fmt.Errorf("expiry: Slices must be at least 3, got %d", c.Slices)
	case c.Markers < c.Slices:
		return fmt.Errorf("expiry: Markers must be at least Slices (%d), got %d", c.Slices, c.Markers)
	case c.Batch < 1 || c.ClaimKeys < c.Batch || c.Runs < 1:
		return fmt.Errorf("expiry: need Batch >= 1, ClaimKeys >= Batch and Runs >= 1, got %d, %d, %d", c.Batch, c.ClaimKeys, c.Runs)
	case c.Drops < 1 || c.Drops > c.Slices-2:
		return fmt.Errorf("expiry: Drops must be between 1 and Slices-2 (%d), got %d", c.Slices-2, c.Drops)
	case c.Steady <= 0 || c.MinWindow <= 0:
		return errors.New("expiry: Steady and MinWindow must be positive")
	}
	return nil
}

// Result is what Run measured.
type Result struct {
	Config  Config
	Server  string // PostgreSQL version
	Current time.Time
	// PerSlice is the number of markers of the slice each expiry removes.
	PerSlice int
	// Load is the time taken to load both tables (side by side) and vacuum
	// them; Warm the time bloom's Maintain and Warm took to build the
	// filters from the store.
	Load, Warm time.Duration
	// Claim is the throughput of new keys, per strategy.
	Bloom, Idset Strategy
	// ClaimRatios are bloom's rate over idset's in each interleaved run,
	// ClaimRatio their median: runs next to each other share the
	// machine's load, so the paired ratio is steadier than the ratio of
	// the two medians.
	ClaimRatios []float64
	ClaimRatio  float64
	// Filter is bloom's filters after the run.
	Filter FilterResult
}

// Strategy is one strategy's measurements.
type Strategy struct {
	// Claimed is the number of new keys claimed in all.
	Claimed int
	// Rates are the keys per second of each throughput run; Rate is
	// their median.
	Rates []float64
	Rate  float64
	// Expiry is the expiry of one slice alone on the server.
	Expiry Expiry
	// During is the expiry of the next slice while claims run; for bloom,
	// the run of median ratio among DuringRuns.
	During     Concurrent
	DuringRuns []Concurrent
}

// Expiry is the cost of removing one slice's markers.
type Expiry struct {
	Took     time.Duration
	WALBytes int64
	Removed  int64 // markers removed
}

// Concurrent is the claim throughput while an expiry runs.
type Concurrent struct {
	Expiry       Expiry  // WALBytes includes the claims' WAL
	Steady       float64 // keys/s over Steady before the expiry and Steady after the window
	During       float64 // keys/s over the window
	Window       time.Duration
	SteadyWorst  time.Duration // longest claim over the steady window
	DuringWorst  time.Duration // longest claim ending in the window
	SteadyClaims int
}

// Ratio is the throughput during the expiry over the steady state.
func (c Concurrent) Ratio() float64 {
	if c.Steady == 0 {
		return 0
	}
	return c.During / c.Steady
}

// FilterResult is bloom's filter memory and measured false-positive rate.
type FilterResult struct {
	Target         float64
	SealedBytes    int64
	SealedKeys     int64
	Tests          int64
	FalsePositives int64
	Rate           float64
	ProbesPerKey   float64
}

// BytesPerKey is the sealed filters' memory per marker.
func (f FilterResult) BytesPerKey() float64 {
	if f.SealedKeys == 0 {
		return 0
	}
	return float64(f.SealedBytes) / float64(f.SealedKeys)
}

type runner struct {
	cfg     Config
	current time.Time // start of the current slice, by the database clock
	bloom   *claimer
	idset   *claimer
}

// Run drops and recreates cfg.Schema in pool's database, loads both
// tables and measures. pool must allow at least four connections.
func Run(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg}
	res := &Result{Config: cfg}
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), now()`).Scan(&res.Server, &r.current); err != nil {
		return nil, err
	}
	r.current = r.current.Truncate(slice).UTC()
	res.Current = r.current
	lo, hi := r.sliceRange(cfg.Slices)
	res.PerSlice = hi - lo + 1

	// Tables.
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{cfg.Schema}.Sanitize()+` CASCADE`); err != nil {
		return nil, err
	}
	// ExpectedKeysPerSlice as a user would set it: the traffic of the
	// current slice, which receives every key the run claims.
	bcfg := bloom.Config{Schema: cfg.Schema, Slice: slice, Retention: time.Duration(cfg.Slices) * slice, ExpectedKeysPerSlice: cfg.CurrentKeys}
	bs, err := bloom.New(bcfg)
	if err != nil {
		return nil, err
	}
	is, err := idset.New(idset.Config{Schema: cfg.Schema, Retention: time.Duration(cfg.Slices) * slice})
	if err != nil {
		return nil, err
	}
	if _, err := pg.Migrate(ctx, pool, cfg.Schema, append(bs.Migrations(), is.Migrations()...)...); err != nil {
		return nil, err
	}
	r.bloom = &claimer{name: "bloom", s: bs, batch: cfg.Batch}
	r.idset = &claimer{name: "idset", s: is, batch: cfg.Batch}

	// Load, side by side, then vacuum and checkpoint as a live table would be.
	cfg.Logf("loading %d markers into each table…", cfg.Markers)
	begin := time.Now()
	if err := both(
		func() error { return r.loadBloom(ctx, pool) },
		func() error { return r.loadIdset(ctx, pool) },
	); err != nil {
		return nil, fmt.Errorf("expiry: loading: %w", err)
	}
	if err := both(
		func() error {
			return exec(ctx, pool, `VACUUM ANALYZE `+pgx.Identifier{cfg.Schema, bloom.DefaultTable}.Sanitize())
		},
		func() error {
			return exec(ctx, pool, `VACUUM ANALYZE `+pgx.Identifier{cfg.Schema, idsetTable}.Sanitize())
		},
	); err != nil {
		return nil, fmt.Errorf("expiry: vacuuming: %w", err)
	}
	if err := exec(ctx, pool, `CHECKPOINT`); err != nil {
		return nil, err
	}
	res.Load = time.Since(begin)
	cfg.Logf("loaded in %v", res.Load.Round(time.Millisecond))

	// Start bloom as the consumer does: Maintain, then Warm.
	begin = time.Now()
	if err := bs.Maintain(ctx, pool); err != nil {
		return nil, err
	}
	if err := bs.Warm(ctx, pool); err != nil {
		return nil, err
	}
	res.Warm = time.Since(begin)
	st := bs.Stats()
	if st.SealedKeys != int64(cfg.Markers) {
		return nil, fmt.Errorf("expiry: bloom's sealed filters hold %d markers, want %d", st.SealedKeys, cfg.Markers)
	}
	res.Filter = FilterResult{Target: bloom.DefaultFalsePositiveRate, SealedBytes: st.SealedBytes, SealedKeys: st.SealedKeys}
	cfg.Logf("bloom warm in %v: %d sealed slices, %.2f bytes per key", res.Warm.Round(time.Millisecond), st.Sealed, res.Filter.BytesPerKey())

	// (a) Throughput, interleaved.
	for run := 1; run <= cfg.Runs; run++ {
		for _, c := range []*claimer{r.bloom, r.idset} {
			d, err := c.claimN(ctx, pool, cfg.ClaimKeys)
			if err != nil {
				return nil, err
			}
			rate := float64(cfg.ClaimKeys) / d.Seconds()
			c.rates = append(c.rates, rate)
			cfg.Logf("run %d: %s %.0f keys/s", run, c.name, rate)
		}
	}

	// (b) One slice's expiry alone, (c) the next one under claims.
	if res.Bloom.Expiry, err = r.expire(ctx, pool, r.bloom, cfg.Slices, true); err != nil {
		return nil, err
	}
	if res.Idset.Expiry, err = r.expire(ctx, pool, r.idset, cfg.Slices, true); err != nil {
		return nil, err
	}
	for d := range cfg.Drops {
		c, err := r.concurrent(ctx, pool, r.bloom, cfg.Slices-1-d)
		if err != nil {
			return nil, err
		}
		res.Bloom.DuringRuns = append(res.Bloom.DuringRuns, c)
	}
	byRatio := slices.SortedFunc(slices.Values(res.Bloom.DuringRuns), func(a, b Concurrent) int { return cmp.Compare(a.Ratio(), b.Ratio()) })
	res.Bloom.During = byRatio[len(byRatio)/2]
	if res.Idset.During, err = r.concurrent(ctx, pool, r.idset, cfg.Slices-1); err != nil {
		return nil, err
	}
	res.Idset.DuringRuns = []Concurrent{res.Idset.During}

	for _, p := range []struct {
		c   *claimer
		out *Strategy
	}{{r.bloom, &res.Bloom}, {r.idset, &res.Idset}} {
		p.out.Claimed = p.c.next
		p.out.Rates = slices.Clone(p.c.rates)
		sorted := slices.Sorted(slices.Values(p.c.rates))
		p.out.Rate = sorted[len(sorted)/2]
	}
	for k := range r.bloom.rates {
		res.ClaimRatios = append(res.ClaimRatios, r.bloom.rates[k]/r.idset.rates[k])
	}
	cfg.Logf("claimed %d new keys with bloom, %d with idset; bloom's current-slice filter is sized for %d", r.bloom.next, r.idset.next, cfg.CurrentKeys)
	sorted := slices.Sorted(slices.Values(res.ClaimRatios))
	res.ClaimRatio = sorted[len(sorted)/2]
	st = bs.Stats()
	res.Filter.Tests = st.Tests
	res.Filter.FalsePositives = st.FalsePositives
	res.Filter.Rate = st.FalsePositiveRate
	if st.Keys > 0 {
		res.Filter.ProbesPerKey = float64(st.Probes) / float64(st.Keys)
	}
	return res, nil
}

// both runs f and g at once and returns their errors.
func both(f, g func() error) error {
	var wg sync.WaitGroup
	var ef, eg error
	wg.Go(func() { ef = f() })
	wg.Go(func() { eg = g() })
	wg.Wait()
	return errors.Join(ef, eg)
}

func exec(ctx context.Context, pool *pgxpool.Pool, sql string) error {
	_, err := pool.Exec(ctx, sql)
	return err
}
