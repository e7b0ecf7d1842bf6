package cli_test

import (
	"strings"
	"testing"
)

// On a database where the library's tables were never created, the
// commands that read them say to run migrate, besides the database's own
// error.
func TestMissingTablesSayMigrate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, args := range [][]string{
		{"parked", "list"},
		{"sweep", "--yes"},
		{"outbox", "stats"},
		{"outbox", "list"},
	} {
		_, err := e.run(stock, "", args...)
		if err == nil {
			t.Errorf("%s on an empty database: no error", strings.Join(args, " "))
			continue
		}
		if !strings.Contains(err.Error(), `"effectively migrate"`) || !strings.Contains(err.Error(), "42P01") {
			t.Errorf("%s on an empty database: %v", strings.Join(args, " "), err)
		}
	}
}

// stats with a schema that does not exist is an error, not an empty
// report; before the first migrate, the default schema's absence is
// reported as such.
func TestStatsMissingSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if r := e.must(stock, "stats"); !strings.Contains(r.err, `schema effectively does not exist yet: run "effectively migrate"`) {
		t.Fatalf("stats before migrate: stderr %q", r.err)
	}
	e.must(stock, "migrate", "--yes")
	_, err := e.run(stock, "", "stats", "--schema", "nosuch")
	if err == nil || !strings.Contains(err.Error(), "schema nosuch does not exist") || !strings.Contains(err.Error(), "--schema") {
		t.Fatalf("stats --schema nosuch: %v", err)
	}
	e.must(stock, "stats")
}

// A --reason no row can have is refused with the valid ones, by every
// command that selects parked rows.
func TestParkedUnknownReason(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must(stock, "migrate", "--yes")
	for _, args := range [][]string{
		{"parked", "list", "--reason", "bogus"},
		{"parked", "purge", "--reason", "bogus", "--yes"},
		{"parked", "redrive", "--scope", "ledger", "--handler", "h", "--reason", "bogus", "--yes"},
	} {
		_, err := e.run(stock, "", args...)
		if err == nil || !strings.Contains(err.Error(), `"bogus" is not a reason`) ||
			!strings.Contains(err.Error(), "invalid_key, permanent, max_attempts, mismatch, gap") {
			t.Errorf("%s: %v", strings.Join(args, " "), err)
		}
	}
	e.must(stock, "parked", "list", "--reason", "max_attempts")
}
