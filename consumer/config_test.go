package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
)

// TestConfigTables: the parked table's schema and name are checked like
// every identifier of the library's configs, with room for its indexes'
// names, and the error matches ErrInvalidConfig under every package's name.
func TestConfigTables(t *testing.T) {
	t.Parallel()
	s, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{})
	base := consumer.Config{Name: "x", Strategy: s, Handler: insertEffect}
	for _, tc := range []struct {
		field, schema, table string
	}{
		{"Schema", strings.Repeat("s", 64), ""},
		{"Schema", "a\x00b", ""},
		{"Schema", "bad\xff", ""},
		{"ParkedTable", "", strings.Repeat("p", 47)}, // "…_message_hash_idx" would be truncated
		{"ParkedTable", "", "a\x00b"},
	} {
		cfg := base
		cfg.Schema, cfg.ParkedTable = tc.schema, tc.table
		_, err := consumer.New(noDB{}, broker, cfg)
		var ce *consumer.ConfigError
		switch {
		case !errors.Is(err, consumer.ErrInvalidConfig) || !errors.Is(err, pg.ErrInvalidConfig):
			t.Errorf("%s %q: New = %v, want ErrInvalidConfig", tc.field, tc.schema+tc.table, err)
		case !errors.As(err, &ce) || ce.Package != "consumer" || ce.Field != tc.field:
			t.Errorf("%s %q: New = %v, want a consumer ConfigError for %s", tc.field, tc.schema+tc.table, err, tc.field)
		case !strings.HasPrefix(err.Error(), "consumer: invalid config: "+tc.field+": "):
			t.Errorf("%s: New = %q, want it to name the field", tc.field, err)
		}
	}
	cfg := base
	cfg.Schema, cfg.ParkedTable = strings.Repeat("s", 63), strings.Repeat("p", 46)
	c, err := consumer.New(noDB{}, broker, cfg)
	if err != nil {
		t.Fatalf("the longest names allowed: %v", err)
	}
	if got := c.Config(); got.Schema != cfg.Schema || got.ParkedTable != cfg.ParkedTable {
		t.Errorf("Config() = %q.%q", got.Schema, got.ParkedTable)
	}
	if _, err := consumer.New(nil, broker, base); !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Errorf("New(nil db) = %v, want ErrInvalidConfig", err)
	}
	// Redrive checks the same table names before it reaches the database.
	_, err = consumer.Redrive(context.Background(), noDB{}, consumer.Config{
		Name: "x", Strategy: s, Handler: insertEffect, ParkedTable: strings.Repeat("p", 47)}, parked.Filter{})
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "ParkedTable" {
		t.Errorf("Redrive with a long ParkedTable = %v, want a ConfigError for it", err)
	}
}

// TestConfigDefaults: the zero Config gets the documented defaults.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	s, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(noDB{}, consumertest.New(consumertest.Config{}), consumer.Config{Name: "x", Strategy: s, Handler: insertEffect})
	if err != nil {
		t.Fatal(err)
	}
	got := c.Config()
	// The defaults the Config fields document.
	if got.BatchSize != 100 || got.Concurrency != 4 ||
		got.MaxAttempts != 10 || got.RetryBackoff != time.Second ||
		got.MaxRetryBackoff != 5*time.Minute || got.GapDelay != time.Second ||
		got.GapMaxAttempts != 60 || got.Schema != pg.DefaultSchema ||
		got.ParkedTable != parked.DefaultTable || got.ShutdownTimeout != 30*time.Second ||
		got.IdleTxTimeout != 10*time.Second || got.MaxKeyLen != dedupe.DefaultMaxIDLen ||
		got.Scope != "x" || got.Logger == nil || got.KeyFunc == nil {
		t.Errorf("defaults: %+v", got)
	}
}
