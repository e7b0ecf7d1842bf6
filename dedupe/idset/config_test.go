package idset_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
)

func TestNewDefaults(t *testing.T) {
	s, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatalf("New(Config{}) = %v", err)
	}
	if s.Name() != "idset" {
		t.Errorf("Name() = %q, want idset", s.Name())
	}
	if s.Retention() != 7*24*time.Hour {
		t.Errorf("Retention() = %v, want 7 days", s.Retention())
	}
	lines := s.Migrations()
	if len(lines) != 1 || lines[0].Name != "idset:effectively.processed" {
		t.Errorf("Migrations() = %+v, want one line idset:effectively.processed", lines)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	long := strings.Repeat("x", 64)
	for _, tc := range []struct {
		field string
		cfg   idset.Config
	}{
		{"Retention", idset.Config{Retention: -time.Second}},
		{"RedeliveryHorizon", idset.Config{RedeliveryHorizon: -time.Second}},
		{"SweepBatch", idset.Config{SweepBatch: -1}},
		{"SweepInterval", idset.Config{SweepInterval: -time.Second}},
		{"MaxIDLen", idset.Config{MaxIDLen: -1}},
		{"MaxIDLen", idset.Config{MaxIDLen: idset.MaxMaxIDLen + 1}},
		{"Schema", idset.Config{Schema: long}},
		{"Schema", idset.Config{Schema: "a\x00b"}},
		{"Table", idset.Config{Table: long}},
		{"Table", idset.Config{Table: "bad\xff"}},
		{"Table", idset.Config{Table: strings.Repeat("é", 32)}}, // 64 bytes
	} {
		s, err := idset.New(tc.cfg)
		var ce *pg.ConfigError
		switch {
		case err == nil:
			t.Errorf("New(%+v) = %v, nil; want an error for %s", tc.cfg, s, tc.field)
		case !errors.Is(err, pg.ErrInvalidConfig):
			t.Errorf("New(%+v) = %v, which is not pg.ErrInvalidConfig", tc.cfg, err)
		case !errors.As(err, &ce) || ce.Field != tc.field || ce.Package != "idset":
			t.Errorf("New(%+v) = %v, want a *pg.ConfigError for idset's field %s", tc.cfg, err, tc.field)
		case !strings.HasPrefix(err.Error(), "idset: invalid config: "+tc.field+": "):
			t.Errorf("New(%+v) = %q, want it to name idset's field %s", tc.cfg, err, tc.field)
		}
	}
}

func TestRetentionShorterThanRedeliveryHorizonWarns(t *testing.T) {
	for _, tc := range []struct {
		retention, horizon time.Duration
		warn               bool
	}{
		{time.Hour, 24 * time.Hour, true},
		{0, 8 * 24 * time.Hour, true}, // the 7-day default is too short
		{24 * time.Hour, 24 * time.Hour, false},
		{48 * time.Hour, 24 * time.Hour, false},
		{time.Hour, 0, false}, // horizon unknown
	} {
		var buf bytes.Buffer
		_, err := idset.New(idset.Config{
			Retention: tc.retention, RedeliveryHorizon: tc.horizon,
			Logger: slog.New(slog.NewTextHandler(&buf, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		if !tc.warn {
			if out != "" {
				t.Errorf("retention %v, horizon %v: unexpected log %q", tc.retention, tc.horizon, out)
			}
			continue
		}
		retention := tc.retention
		if retention == 0 {
			retention = idset.DefaultRetention
		}
		for _, want := range []string{"level=WARN", "retention=" + retention.String(), "redelivery_horizon=" + tc.horizon.String()} {
			if !strings.Contains(out, want) {
				t.Errorf("retention %v, horizon %v: log %q lacks %q", tc.retention, tc.horizon, out, want)
			}
		}
	}
}

func TestClaimRejectsBadKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStrategy(t, idset.Config{})
	good := dedupe.Key{Scope: "s", ID: "good"}
	for _, tc := range []struct {
		name string
		key  dedupe.Key
	}{
		{"empty id", dedupe.Key{Scope: "s"}},
		{"empty scope", dedupe.Key{ID: "x"}},
		{"NUL in id", dedupe.Key{Scope: "s", ID: "a\x00b"}},
		{"NUL in scope", dedupe.Key{Scope: "s\x00", ID: "a"}},
		{"invalid UTF-8 id", dedupe.Key{Scope: "s", ID: "a\xc3\x28"}},
		{"oversized id", dedupe.Key{Scope: "s", ID: strings.Repeat("x", dedupe.DefaultMaxIDLen+1)}},
		{"oversized scope", dedupe.Key{Scope: strings.Repeat("x", dedupe.DefaultMaxIDLen+1), ID: "a"}},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		vs, err := s.Claim(ctx, tx, []dedupe.Key{good, tc.key})
		var ke *dedupe.KeyError
		if !errors.As(err, &ke) || !errors.Is(err, dedupe.ErrInvalidKey) {
			t.Errorf("%s: Claim = %v, %v; want a *dedupe.KeyError", tc.name, vs, err)
		} else if ke.Key.ID != tc.key.ID || ke.Key.Scope != tc.key.Scope {
			t.Errorf("%s: KeyError names key %v, want %v", tc.name, ke.Key, tc.key)
		}
		// The transaction is still usable and the batch claimed nothing.
		if err := tx.Commit(ctx); err != nil {
			t.Errorf("%s: commit after the refused claim: %v", tc.name, err)
		}
	}
	if vs := claimKeys(t, s, pool, []dedupe.Key{good}); vs[0] != dedupe.VerdictNew {
		t.Errorf("the valid key of refused batches is %v, want new", vs[0])
	}

	// A longer limit admits longer IDs.
	long, pool2 := newStrategy(t, idset.Config{MaxIDLen: idset.MaxMaxIDLen})
	k := dedupe.Key{Scope: strings.Repeat("s", idset.MaxMaxIDLen), ID: strings.Repeat("é", idset.MaxMaxIDLen/2)}
	if vs := claimKeys(t, long, pool2, []dedupe.Key{k, k}); vs[0] != dedupe.VerdictNew || vs[1] != dedupe.VerdictDuplicate {
		t.Errorf("key at MaxIDLen: %v, want [new duplicate]", vs)
	}
}
