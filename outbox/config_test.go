package outbox

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestRelayConfigRefusals(t *testing.T) {
	sinks := map[string]Sink{"s": newMemSink()}
	for _, tc := range []struct {
		name string
		cfg  RelayConfig
		want string
	}{
		{"no sinks", RelayConfig{}, "Sinks is required"},
		{"nil sink", RelayConfig{Sinks: map[string]Sink{"s": nil}}, "is nil"},
		{"margin", RelayConfig{Sinks: sinks, LeaseTTL: time.Second, LeaseMargin: time.Second}, "LeaseMargin"},
		{"backoff", RelayConfig{Sinks: sinks, MinBackoff: time.Second, MaxBackoff: time.Millisecond}, "MaxBackoff"},
		{"negative", RelayConfig{Sinks: sinks, BatchSize: -1}, "negative"},
	} {
		if _, err := NewRelay(pgtest.NewPool(t), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(Config{Sinks: []string{""}}); err == nil {
		t.Error("an empty sink name in Config.Sinks was accepted")
	}
	if _, err := New(Config{Mode: 7}); err == nil || !strings.Contains(err.Error(), "Mode") {
		t.Errorf("Config.Mode 7: got %v, want an error naming Mode", err)
	}
}

// TestOwnNames: an outbox in a schema and table of its own, with names
// that need quoting, long enough that a NOTIFY channel named after them
// would be cut: printed by MigrationSQL, run by hand, then used.
func TestOwnNames(t *testing.T) {
	db := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := New(Config{Table: strings.Repeat("t", 55)}); err == nil || !strings.Contains(err.Error(), "54 bytes") {
		t.Fatalf("a table name PostgreSQL would cut: %v", err)
	}
	cfg := Config{Schema: "Pipeline Stage \"A\" of the ledger", Table: "Outbox of stage \"A\", its own one", Mode: TableMode}
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	script, err := pg.MigrationSQL(cfg.Schema, o.Line())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, script); err != nil {
		t.Fatalf("the printed migrations failed: %v", err)
	}
	if pending, err := pg.PendingMigrations(ctx, db, cfg.Schema, o.Line()); err != nil || len(pending) != 0 {
		t.Fatalf("pending after the script: %v, %v", pending, err)
	}
	emit(t, db, o, msg("k", "m1"))
	sink := newMemSink()
	listening := make(chan struct{})
	var once sync.Once
	startRelay(t, db, RelayConfig{Schema: cfg.Schema, Table: cfg.Table, Sinks: map[string]Sink{"s": sink},
		PollInterval: 10 * time.Minute, LeaseTTL: 30 * time.Minute,
		onListen: func() { once.Do(func() { close(listening) }) }})
	<-listening
	sink.waitFor(t, 2*time.Minute, "m1", hasIDs("m1"))
	emit(t, db, o, msg("k", "m2")) // only NOTIFY can wake the relay in time
	sink.waitFor(t, 2*time.Minute, "m2", hasIDs("m2"))
}
