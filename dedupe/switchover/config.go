package switchover

import (
	"log/slog"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
)

// Config configures a Migration from one strategy to another.
type Config struct {
	// Old is the strategy the consumer used until now. Its store is only
	// read: claims of it run under a savepoint that is rolled back, so it
	// gets no new markers. Required.
	Old dedupe.Strategy
	// New is the strategy the consumer uses from now on. Required; it must
	// not be Old, nor keep its markers in Old's tables.
	New dedupe.Strategy
	// Since is when the switch began: when the first consumer of the scope
	// ran with this Migration, so that Old took no more markers. With Until
	// zero, Old is consulted until Since plus Old's retention (Old must then
	// be a dedupe.Retainer). Defaults to zero: Until must be set.
	Since time.Time
	// Until is when Old stops being consulted: from then on, claims go to
	// New alone, and Old's tables can be dropped once every consumer of the
	// scope is past it. It must be no earlier than the last marker Old
	// wrote plus the source's redelivery horizon (for an Old whose markers
	// expire, Since plus its retention is that bound, or later). Defaults to
	// Since plus Old's retention.
	Until time.Time
	// Now is the clock compared with Until. Defaults to time.Now.
	Now func() time.Time
	// Logger receives the start and end of the consultation and the errors
	// of the strategies' background upkeep. Defaults to warnings and errors
	// on stderr.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	if c.Until.IsZero() && !c.Since.IsZero() {
		if r, ok := c.Old.(dedupe.Retainer); ok {
			c.Until = c.Since.Add(r.Retention())
		}
	}
	return c
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("switchover", field, format, args...)
	}
	switch {
	case c.Old == nil:
		return bad("Old", "is required: the strategy whose store is consulted")
	case c.New == nil:
		return bad("New", "is required: the strategy that takes over")
	case c.Old == c.New:
		return bad("New", "is the same strategy as Old")
	case c.Until.IsZero() && c.Since.IsZero():
		return bad("Until", "is required (or Since, with an Old strategy whose markers expire): when Old stops being consulted")
	case c.Until.IsZero():
		return bad("Until", "is required: the old strategy %s is not a dedupe.Retainer (its markers do not expire), so Since alone does not say when it stops being consulted; set Until to the last marker it wrote plus the source's redelivery horizon", c.Old.Name())
	case !c.Since.IsZero() && c.Until.Before(c.Since):
		return bad("Until", "%s is before Since %s", c.Until.Format(time.RFC3339), c.Since.Format(time.RFC3339))
	}
	if err := sharedLine(c.Old, c.New); err != nil {
		return bad("New", "%v", err)
	}
	return nil
}

// ShadowConfig configures a Shadow.
type ShadowConfig struct {
	// Live is the strategy whose verdicts decide. Required.
	Live dedupe.Strategy
	// Shadow is the strategy tried beside it: it claims every batch too,
	// under a savepoint, and keeps its markers, which commit or roll back
	// with the batch exactly as Live's do, so that it learns the traffic.
	// Its verdicts, errors and refusals never change an outcome. Required;
	// it must not be Live, nor keep its markers in Live's tables.
	Shadow dedupe.Strategy
	// OnDisagree, when set, is called for every key whose verdicts differ,
	// in the claiming goroutine, before the batch's handlers run: it must
	// be quick, and it sees claims that may still roll back.
	OnDisagree func(Disagreement)
	// LogEvery is the least time between two log lines about disagreements
	// or shadow errors; each line carries a sample and the counts since the
	// last one. Negative turns them off. Defaults to 1 minute.
	LogEvery time.Duration
	// Logger receives those lines (at Info for disagreements, Warn for
	// errors) and the errors of the strategies' background upkeep. Defaults
	// to warnings and errors on stderr.
	Logger *slog.Logger
}

// DefaultLogEvery is ShadowConfig.LogEvery's default.
const DefaultLogEvery = time.Minute

func (c ShadowConfig) withDefaults() ShadowConfig {
	if c.LogEvery == 0 {
		c.LogEvery = DefaultLogEvery
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	return c
}

func (c ShadowConfig) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("switchover", field, format, args...)
	}
	switch {
	case c.Live == nil:
		return bad("Live", "is required: the strategy whose verdicts decide")
	case c.Shadow == nil:
		return bad("Shadow", "is required: the strategy tried beside Live")
	case c.Live == c.Shadow:
		return bad("Shadow", "is the same strategy as Live")
	}
	if err := sharedLine(c.Live, c.Shadow); err != nil {
		return bad("Shadow", "%v", err)
	}
	return nil
}

// sharedLine reports two strategies whose migration lines share a name:
// they would keep their markers in the same tables, so one's markers would
// be the other's.
func sharedLine(a, b dedupe.Strategy) error {
	am, ok1 := a.(dedupe.Migrator)
	bm, ok2 := b.(dedupe.Migrator)
	if !ok1 || !ok2 {
		return nil
	}
	names := map[string]bool{}
	for _, l := range am.Migrations() {
		names[l.Name] = true
	}
	for _, l := range bm.Migrations() {
		if names[l.Name] {
			return errSameTables(l.Name)
		}
	}
	return nil
}

type errSameTables string

func (e errSameTables) Error() string {
	return "keeps its markers in the same tables as the other strategy (" + string(e) + "): give it a table of its own"
}
