package effprom_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/dedupe/switchover"
	"github.com/effectively-once/effectively/metrics/effprom"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
	prom "github.com/prometheus/client_golang/prometheus"
)

// A watched Shadow's disagreements and a watched Migration's lookups are
// exported at each scrape.
func TestSwitchoverMetrics(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	mk := func(table string) *idset.Strategy {
		s, err := idset.New(idset.Config{Table: table, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pg.Migrate(ctx, pool, "", s.Migrations()...); err != nil {
			t.Fatal(err)
		}
		return s
	}
	live, shadowed, newer := mk("live"), mk("shadowed"), mk("newer")
	claim := func(s dedupe.Strategy, ids ...string) {
		keys := make([]dedupe.Key, len(ids))
		for i, id := range ids {
			keys[i] = dedupe.Key{Scope: "s", ID: id}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := s.Claim(ctx, tx, keys); return err }); err != nil {
			t.Fatal(err)
		}
	}
	claim(live, "a") // before the shadow and the switch

	sh, err := switchover.NewShadow(switchover.ShadowConfig{Live: live, Shadow: shadowed, LogEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour).Truncate(time.Second)
	mig, err := switchover.New(switchover.Config{Old: live, New: newer, Until: until})
	if err != nil {
		t.Fatal(err)
	}
	m, err := effprom.NewSwitchover(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WatchShadow("orders", sh); err != nil {
		t.Fatal(err)
	}
	if err := m.WatchShadow("orders", sh); !errors.Is(err, effprom.ErrAlreadyWatched) {
		t.Errorf("second WatchShadow: %v, want ErrAlreadyWatched", err)
	}
	if err := m.WatchMigration("orders", mig); err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)

	claim(sh.Strategy(), "a", "b") // live: duplicate, new; shadow: new, new
	claim(mig.Strategy(), "a", "c")
	s := gather(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"effectively_shadow_keys_total", nil, 2},
		{"effectively_shadow_compared_total", nil, 2},
		{"effectively_shadow_disagreements_total", nil, 1},
		{"effectively_shadow_verdicts_total", []string{"live=duplicate", "shadow=new"}, 1},
		{"effectively_shadow_verdicts_total", []string{"live=new", "shadow=new"}, 1},
		{"effectively_shadow_verdicts_total", []string{"live=new", "shadow=duplicate"}, 0},
		{"effectively_shadow_errors_total", nil, 0},
		{"effectively_switchover_keys_total", nil, 2},
		{"effectively_switchover_lookups_total", nil, 2},
		{"effectively_switchover_known_to_old_total", nil, 1},
		{"effectively_switchover_consulting", nil, 1},
		{"effectively_switchover_until_timestamp_seconds", nil, float64(until.Unix())},
	} {
		if got := s.value(t, c.name, append([]string{"consumer=orders"}, c.labels...)...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	m.Unwatch("orders")
	if n := len(gather(t, reg)); n != 0 {
		t.Errorf("%d families after Unwatch, want none", n)
	}
	if _, err := effprom.NewSwitchover(effprom.Options{ConstLabels: map[string]string{"live": "x"}}); !errors.Is(err, effprom.ErrInvalidOptions) {
		t.Errorf("ConstLabels with live: %v, want ErrInvalidOptions", err)
	}
}
