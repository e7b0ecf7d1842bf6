package pg_test

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func line(files ...string) pg.Line {
	fs := fstest.MapFS{}
	idents := map[string]string{}
	for i, f := range files {
		name := "t_" + string(rune('a'+i))
		idents[name] = name
		fs[f] = &fstest.MapFile{Data: []byte(`CREATE TABLE {{schema}}.{{` + name + `}} (id int)`)}
	}
	return pg.Line{Name: "test:t", FS: fs, Idents: idents}
}

// PendingMigrations lists what Migrate would apply, and changes nothing:
// all of a line on an empty database, then only the versions added since.
func TestPendingMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	one := line("001_a.sql")
	pending, err := pg.PendingMigrations(ctx, pool, "app", one)
	if err != nil || len(pending) != 1 || pending[0].Version != 1 {
		t.Fatalf("pending on an empty database: %v, %v; want version 1", pending, err)
	}
	var schemas int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'app'`).Scan(&schemas); err != nil || schemas != 0 {
		t.Fatalf("PendingMigrations created the schema (%v)", err)
	}
	if applied, err := pg.Migrate(ctx, pool, "app", one); err != nil || len(applied) != 1 {
		t.Fatalf("Migrate: %v, %v", applied, err)
	}
	if pending, err := pg.PendingMigrations(ctx, pool, "app", one); err != nil || len(pending) != 0 {
		t.Fatalf("pending after Migrate: %v, %v; want none", pending, err)
	}
	two := line("001_a.sql", "002_b.sql")
	pending, err = pg.PendingMigrations(ctx, pool, "app", two)
	if err != nil || len(pending) != 1 || pending[0].Version != 2 || pending[0].Name != "b" {
		t.Fatalf("pending after a new version: %v, %v; want 002_b", pending, err)
	}
}

// The script of MigrationSQL, run by hand, leaves nothing pending.
func TestMigrationSQLLeavesNothingPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	l := line("001_a.sql", "002_b.sql")
	script, err := pg.MigrationSQL("", l)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("%v\n%s", err, script)
	}
	if pending, err := pg.PendingMigrations(ctx, pool, "", l); err != nil || len(pending) != 0 {
		t.Fatalf("pending after the script: %v, %v; want none", pending, err)
	}
}
