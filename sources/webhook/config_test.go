package webhook_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/webhook"
)

func TestConfig(t *testing.T) {
	ok := webhook.Config{Verifier: webhook.Unverified(), ID: webhook.JSONField("id"), Logger: slog.New(slog.DiscardHandler)}
	cases := []struct {
		field string
		edit  func(*webhook.Config)
	}{
		{"Verifier", func(c *webhook.Config) { c.Verifier = nil }},
		{"ID", func(c *webhook.Config) { c.ID = nil }},
		{"Lanes", func(c *webhook.Config) { c.Lanes = -1 }},
		{"MaxBodyBytes", func(c *webhook.Config) { c.MaxBodyBytes = -1 }},
		{"MaxQueued", func(c *webhook.Config) { c.MaxQueued = -1 }},
		{"MaxTracked", func(c *webhook.Config) { c.MaxTracked = -1 }},
		{"RedeliveryHorizon", func(c *webhook.Config) { c.RedeliveryHorizon = -1 }},
		{"Headers", func(c *webhook.Config) { c.Headers = []string{""} }},
		{"AttemptsTable", func(c *webhook.Config) { c.AttemptsTable = strings.Repeat("a", 64) }},
	}
	for _, c := range cases {
		cfg := ok
		c.edit(&cfg)
		_, err := webhook.New(cfg)
		var ce *webhook.ConfigError
		if !errors.Is(err, pg.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("bad %s: %v, want a ConfigError for it", c.field, err)
		}
	}
	if _, err := webhook.New(webhook.Config{ID: webhook.JSONField("id"), Logger: ok.Logger}); err == nil || !strings.Contains(err.Error(), "Unverified") {
		t.Errorf("no Verifier: %v; want an error that names webhook.Unverified()", err)
	}
	src, err := webhook.New(ok)
	if err != nil {
		t.Fatal(err)
	}
	if src.Running() {
		t.Error("a new source says a consumer is fetching")
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
}
