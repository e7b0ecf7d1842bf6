package failover

import (
	"context"

	"github.com/effectively-once/effectively/pgtest"
)

// servers is the primary and the standby a failover test runs on: started
// and promoted by the test (replicated), or managed by Patroni
// (patroni_test.go).
type servers interface {
	// createDatabase creates the database name on the primary and returns
	// its multi-host connection string (see url).
	createDatabase(ctx context.Context, name string) (string, error)
	// url returns the multi-host connection string of the database name,
	// with target_session_attrs=read-write.
	url(name string) string
	// primary and standby return the URL of the "postgres" database on
	// the server that was the primary (the standby) when the test started.
	primary() string
	standby() string
	// killPrimary kills the primary's processes with SIGKILL.
	killPrimary() error
	// promote returns once the standby accepts writes, having promoted it
	// or waited for the HA manager to.
	promote(ctx context.Context) error
	// catchUp returns once the standby has replayed what the primary had
	// committed.
	catchUp(ctx context.Context) error
	// stopStreaming cuts the standby off from the primary.
	stopStreaming(ctx context.Context) error
	// newStandby gives the promoted standby a streaming standby, or waits
	// until the HA manager has, and returns what stops it.
	newStandby(ctx context.Context) (stop func() error, err error)
}

// replicated is a primary and a streaming standby started by pgtest,
// promoted by the test.
type replicated struct{ r *pgtest.Replicated }

func (s replicated) createDatabase(ctx context.Context, name string) (string, error) {
	return s.r.CreateDatabase(ctx, name)
}
func (s replicated) url(name string) string                  { return s.r.URL(name) }
func (s replicated) primary() string                         { return s.r.Primary.URL() }
func (s replicated) standby() string                         { return s.r.Standby.URL() }
func (s replicated) killPrimary() error                      { return s.r.KillPrimary() }
func (s replicated) promote(ctx context.Context) error       { return s.r.Promote(ctx) }
func (s replicated) catchUp(ctx context.Context) error       { return s.r.CatchUp(ctx) }
func (s replicated) stopStreaming(ctx context.Context) error { return s.r.StopStreaming(ctx) }
func (s replicated) newStandby(ctx context.Context) (func() error, error) {
	c, err := s.r.NewStandby(ctx, s.r.Standby)
	if err != nil {
		return nil, err
	}
	return c.Stop, nil
}
