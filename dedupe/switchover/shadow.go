package switchover

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

// shadowSavepoint is the savepoint under which the shadow strategy claims:
// released when its claim succeeds, so that its markers commit with the
// batch, and rolled back when it fails, so that the batch goes on.
const shadowSavepoint = "effectively_switchover_shadow"

// Shadow runs a second strategy beside the live one without changing any
// outcome, and counts where their verdicts disagree, so that a strategy
// can be tried on production traffic before switching to it.
//
// Give the consumer Strategy(), not the Shadow. A Shadow is safe for
// concurrent use.
type Shadow struct {
	core     *shadow
	strategy dedupe.Strategy
}

// NewShadow returns a Shadow for cfg, or a *pg.ConfigError (matching
// pg.ErrInvalidConfig) for a bad value.
func NewShadow(cfg ShadowConfig) (*Shadow, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &shadow{
		pair: pair{first: cfg.Live, second: cfg.Shadow, role: [2]string{"live", "shadow"}, log: cfg.Logger},
		cfg:  cfg, live: cfg.Live, sh: cfg.Shadow,
		taught: map[identity]bool{},
	}
	c.liveCommitter, _ = cfg.Live.(dedupe.Committer)
	c.shadowCommitter, _ = cfg.Shadow.(dedupe.Committer)
	c.shadowChecker, _ = cfg.Shadow.(dedupe.KeyChecker)
	if sq, ok := cfg.Live.(dedupe.Sequencer); ok {
		c.sequenced = sq.Sequenced()
	}
	r, _ := cfg.Live.(dedupe.Retainer)
	return &Shadow{core: c, strategy: assemble(c, checkers(cfg.Live), r)}, nil
}

// Strategy returns the dedupe.Strategy to give the consumer. Its name,
// verdicts, key checks (dedupe.KeyChecker), order (dedupe.Sequencer),
// retention (dedupe.Retainer) and inspection (dedupe.Inspector) are the
// live strategy's; its tables, maintenance and warm-up are both
// strategies'.
func (s *Shadow) Strategy() dedupe.Strategy { return s.strategy }

// Disagreement is one key on which the two strategies' verdicts differ.
type Disagreement struct {
	Key dedupe.Key
	// Live is the verdict that decided; Shadow is the one the shadow
	// strategy would have given.
	Live, Shadow dedupe.Verdict
}

// ShadowStats counts what a Shadow saw, since NewShadow. Claims that
// later rolled back are counted too: the consumer claims again what it
// retries, so a key may be counted more than once.
type ShadowStats struct {
	// Keys counts the keys claimed by the live strategy.
	Keys uint64
	// Compared counts the keys both strategies gave a verdict for.
	Compared uint64
	// Disagreements counts the compared keys whose verdicts differ.
	Disagreements uint64
	// Pairs counts the compared keys by verdicts: Pairs[live][shadow],
	// indexed by dedupe.Verdict (index 0 is unused). The diagonal is the
	// agreements. Pairs[dedupe.VerdictDuplicate][dedupe.VerdictNew] are
	// keys the shadow strategy would have applied again;
	// Pairs[dedupe.VerdictNew][dedupe.VerdictDuplicate] are messages it
	// would have dropped as duplicates.
	Pairs [5][5]uint64
	// Refused counts keys the shadow strategy's CheckKey refused: not
	// claimed by it, not compared.
	Refused uint64
	// Errors counts the shadow claims that failed (their savepoint was
	// rolled back; the batch went on with the live verdicts); their keys
	// are not compared.
	Errors uint64
	// LastError is the last such failure, or nil.
	LastError error
}

// Stats returns the Shadow's counters.
func (s *Shadow) Stats() ShadowStats { return s.core.stats() }

// maxTaught bounds the identities remembered between a claim and its
// Committed report.
const maxTaught = 1 << 20

// shadow is the Strategy a Shadow hands out, before assemble adds
// KeyChecker and Retainer.
type shadow struct {
	pair
	cfg       ShadowConfig
	live, sh  dedupe.Strategy
	sequenced bool

	liveCommitter, shadowCommitter dedupe.Committer
	shadowChecker                  dedupe.KeyChecker

	// taught holds the identities the shadow strategy called new in its
	// latest claim of them, until Committed reports them: what to tell its
	// Committer. A later claim of an identity replaces its entry.
	taughtMu sync.Mutex
	taught   map[identity]bool

	mu        sync.Mutex // guards the counters below
	counts    ShadowStats
	sinceLog  ShadowStats // counts at the last log line
	lastLog   time.Time
	sample    *Disagreement
	errSample error
}

var _ core = (*shadow)(nil)

// Name returns the live strategy's name.
func (s *shadow) Name() string { return s.live.Name() }

// Sequenced is the live strategy's (dedupe.Sequencer).
func (s *shadow) Sequenced() bool { return s.sequenced }

// Claim returns the live strategy's verdicts for keys. Then the shadow
// strategy claims the keys its CheckKey accepts, under a savepoint that is
// released when the claim succeeds, so that its markers commit or roll
// back with the batch as the live ones do; when it fails the savepoint is
// rolled back, the failure counted and logged, and the live verdicts stand.
// Only an error of the transaction itself (the savepoint commands failing)
// fails the claim.
func (s *shadow) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	verdicts, err := s.live.Claim(ctx, tx, keys)
	if err != nil || len(keys) == 0 || len(verdicts) != len(keys) {
		return verdicts, err
	}
	sk, at := keys, []int(nil)
	if s.shadowChecker != nil {
		at = make([]int, 0, len(keys))
		for i, k := range keys {
			if s.shadowChecker.CheckKey(k) == nil {
				at = append(at, i)
			}
		}
		if len(at) == len(keys) {
			at = nil
		} else {
			sk = make([]dedupe.Key, len(at))
			for j, i := range at {
				sk[j] = keys[i]
			}
		}
	}
	var svs []dedupe.Verdict
	var serr error
	if len(sk) > 0 {
		err = savepoint(ctx, tx, shadowSavepoint, true, func() error {
			svs, serr = s.sh.Claim(ctx, tx, sk)
			if serr == nil && len(svs) != len(sk) {
				serr = fmt.Errorf("%d verdicts for %d keys", len(svs), len(sk))
			}
			return serr
		})
		var te *txError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("switchover: shadow strategy %s: %w", s.sh.Name(), err)
		}
	}
	if serr != nil {
		svs = nil
	}
	s.record(keys, verdicts, sk, at, at != nil, svs, serr)
	return verdicts, nil
}

// record teaches, counts and reports one claim's verdicts. sk are the keys
// the shadow claimed: keys itself, or (when filtered) keys[at[j]].
func (s *shadow) record(keys []dedupe.Key, live []dedupe.Verdict, sk []dedupe.Key, at []int, filtered bool, svs []dedupe.Verdict, serr error) {
	var diffs []Disagreement
	var pairs [5][5]uint64
	if svs != nil {
		s.taughtMu.Lock()
		if len(s.taught) > maxTaught {
			// Claims that rolled back leave entries behind until their
			// keys are claimed again; forgetting them all only makes the
			// shadow strategy's memory lag.
			clear(s.taught)
		}
		seen := make(map[identity]bool, len(sk))
		for j, k := range sk {
			id := identityOf(k)
			if !seen[id] { // the first occurrence decides what the claim taught
				seen[id] = true
				if svs[j] == dedupe.VerdictNew {
					s.taught[id] = true
				} else {
					delete(s.taught, id)
				}
			}
			i := j
			if filtered {
				i = at[j]
			}
			lv, sv := live[i], svs[j]
			if lv < 5 && sv < 5 {
				pairs[lv][sv]++
			}
			if lv != sv {
				diffs = append(diffs, Disagreement{Key: k, Live: lv, Shadow: sv})
			}
		}
		s.taughtMu.Unlock()
	}
	if s.cfg.OnDisagree != nil {
		for _, d := range diffs {
			s.cfg.OnDisagree(d)
		}
	}

	s.mu.Lock()
	c := &s.counts
	c.Keys += uint64(len(keys))
	if filtered {
		c.Refused += uint64(len(keys) - len(sk))
	}
	if serr != nil {
		c.Errors++
		c.LastError = serr
		s.errSample = serr
	} else {
		c.Compared += uint64(len(sk))
		c.Disagreements += uint64(len(diffs))
		for a := range pairs {
			for b := range pairs[a] {
				c.Pairs[a][b] += pairs[a][b]
			}
		}
		if len(diffs) > 0 {
			s.sample = &diffs[0]
		}
	}
	s.maybeLog()
	s.mu.Unlock()
}

// maybeLog writes one line about what changed since the last line, at most
// every LogEvery. s.mu is held.
func (s *shadow) maybeLog() {
	if s.cfg.LogEvery < 0 || (s.sample == nil && s.errSample == nil) {
		return
	}
	now := time.Now()
	if !s.lastLog.IsZero() && now.Sub(s.lastLog) < s.cfg.LogEvery {
		return
	}
	c, last := s.counts, s.sinceLog
	attrs := []any{"live", s.live.Name(), "shadow", s.sh.Name(),
		"compared", c.Compared - last.Compared, "disagreements", c.Disagreements - last.Disagreements}
	if d := s.sample; d != nil {
		s.cfg.Logger.Info("switchover: the shadow strategy disagrees with the live one; the live verdicts stand",
			append(attrs, "sample_key", d.Key.String(), "sample_live", d.Live.String(), "sample_shadow", d.Shadow.String(),
				"would_apply_again", c.Pairs[dedupe.VerdictDuplicate][dedupe.VerdictNew]-last.Pairs[dedupe.VerdictDuplicate][dedupe.VerdictNew],
				"would_drop", c.Pairs[dedupe.VerdictNew][dedupe.VerdictDuplicate]-last.Pairs[dedupe.VerdictNew][dedupe.VerdictDuplicate])...)
	}
	if s.errSample != nil {
		s.cfg.Logger.Warn("switchover: the shadow strategy's claims failed; their savepoints were rolled back and the live verdicts stand",
			append(attrs, "errors", c.Errors-last.Errors, "err", s.errSample)...)
	}
	s.lastLog, s.sinceLog, s.sample, s.errSample = now, c, nil, nil
}

func (s *shadow) stats() ShadowStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// Committed reports the verdicts to the live strategy, and to the shadow
// strategy the keys that its own claim made new (dedupe.Committer). A key
// whose shadow verdict is no longer known (another claim of it came in
// between) is not reported to the shadow strategy: its memory may lag
// behind its store, never run ahead of it.
func (s *shadow) Committed(keys []dedupe.Key, verdicts []dedupe.Verdict) {
	if s.liveCommitter != nil {
		s.liveCommitter.Committed(keys, verdicts)
	}
	var ks []dedupe.Key
	s.taughtMu.Lock()
	for _, k := range keys[:min(len(keys), len(verdicts))] {
		id := identityOf(k)
		if s.taught[id] {
			delete(s.taught, id)
			ks = append(ks, k)
		}
	}
	s.taughtMu.Unlock()
	if s.shadowCommitter != nil && len(ks) > 0 {
		vs := make([]dedupe.Verdict, len(ks))
		for i := range vs {
			vs[i] = dedupe.VerdictNew
		}
		s.shadowCommitter.Committed(ks, vs)
	}
}

// MarkerStats reports the live strategy's markers (dedupe.Inspector).
func (s *shadow) MarkerStats(ctx context.Context, db pg.DB, scope string) (dedupe.MarkerStats, error) {
	insp, ok := s.live.(dedupe.Inspector)
	if !ok {
		return dedupe.MarkerStats{Strategy: s.Name()}, fmt.Errorf("switchover: the live strategy %s is not a dedupe.Inspector", s.live.Name())
	}
	return insp.MarkerStats(ctx, db, scope)
}

// SweepExpired sweeps the live strategy's markers (dedupe.Inspector); the
// shadow strategy's are swept by its own maintenance.
func (s *shadow) SweepExpired(ctx context.Context, db pg.DB, dryRun bool) (dedupe.SweepReport, error) {
	insp, ok := s.live.(dedupe.Inspector)
	if !ok {
		return dedupe.SweepReport{}, fmt.Errorf("switchover: the live strategy %s is not a dedupe.Inspector: %w", s.live.Name(), dedupe.ErrNoSweep)
	}
	return insp.SweepExpired(ctx, db, dryRun)
}
