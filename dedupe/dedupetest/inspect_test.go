package dedupetest_test

import (
	"context"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
)

// Broken inspectors: idset with one Inspector method gone wrong.
func init() {
	// MarkerStats ignores its scope filter.
	broken["unfiltered"] = brokenCase{wrap: func(s *idset.Strategy) dedupe.Strategy {
		return unfiltered{s}
	}, catches: []string{"InspectorStats"}}
	// The dry run sweeps every marker.
	broken["sweepall"] = brokenCase{wrap: func(s *idset.Strategy) dedupe.Strategy {
		return sweepAll{s}
	}, catches: []string{"InspectorSweep"}}
}

type unfiltered struct{ *idset.Strategy }

func (u unfiltered) MarkerStats(ctx context.Context, db pg.DB, _ string) (dedupe.MarkerStats, error) {
	return u.Strategy.MarkerStats(ctx, db, "")
}

type sweepAll struct{ *idset.Strategy }

func (s sweepAll) SweepExpired(ctx context.Context, db pg.DB, dryRun bool) (dedupe.SweepReport, error) {
	if _, err := db.Exec(ctx, `DELETE FROM effectively.processed`); err != nil {
		return dedupe.SweepReport{}, err
	}
	return s.Strategy.SweepExpired(ctx, db, dryRun)
}
