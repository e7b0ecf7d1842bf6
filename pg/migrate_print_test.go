package pg_test

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A name that would end a -- comment or hide what it is is refused before
// any SQL is written, in the schema, in a table and in a line's name.
func TestMigrationSQLRefusesUnprintableNames(t *testing.T) {
	t.Parallel()
	const drop = "DROP TABLE victim; --"
	for _, bad := range []string{"x\n" + drop, "x\r" + drop, "x\r\n" + drop, "x\x00y", "x\ty", "x\u2028" + drop, "x\xff"} {
		if script, err := pg.MigrationSQL(bad, line("001_a.sql")); err == nil {
			t.Errorf("schema %q: no error, script:\n%s", bad, script)
		}
		l := line("001_a.sql")
		l.Idents["t_a"] = bad
		if script, err := pg.MigrationSQL("app", l); err == nil || !strings.Contains(err.Error(), "t_a") {
			t.Errorf("table %q: %v, want an error naming the placeholder; script:\n%s", bad, err, script)
		}
		l = line("001_a.sql")
		l.Name = "test:" + bad
		if script, err := pg.MigrationSQL("app", l); err == nil {
			t.Errorf("line name %q: no error, script:\n%s", bad, script)
		}
	}
}

// Every name MigrationSQL writes stays where it is put, whatever
// characters it holds (quotes, backslashes, comment markers) and whatever
// standard_conforming_strings says: run on a database, the script creates
// its tables, records its versions under the names given, and runs
// nothing else.
func TestMigrationSQLNamesCannotRunStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE victim (id int)`); err != nil {
		t.Fatal(err)
	}
	names := []string{
		`test:quote'); DROP TABLE victim; --`,
		`test:backslash\'); DROP TABLE victim; --`,
		`test:comment */ -- DROP TABLE victim;`,
		`test:"double" $$dollar$$ DROP TABLE victim;`,
	}
	for i, sc := range []string{"on", "off"} {
		for j, name := range names {
			schema := "app" + string(rune('a'+i*len(names)+j))
			l := pg.Line{Name: name, FS: fstest.MapFS{"001_a.sql": {Data: []byte(`CREATE TABLE {{schema}}.{{t}} (id int)`)}},
				Idents: map[string]string{"t": `t"; DROP TABLE victim; --`}}
			script, err := pg.MigrationSQL(schema, l)
			if err != nil {
				t.Fatalf("%q: %v", name, err)
			}
			err = runScript(ctx, pool, sc, script)
			if err != nil {
				t.Fatalf("standard_conforming_strings %s, %q: %v\n%s", sc, name, err, script)
			}
			var recorded string
			if err := pool.QueryRow(ctx, `SELECT line FROM `+schema+`.schema_migrations`).Scan(&recorded); err != nil || recorded != name {
				t.Fatalf("standard_conforming_strings %s: recorded line %q (%v), want %q\n%s", sc, recorded, err, name, script)
			}
			if pending, err := pg.PendingMigrations(ctx, pool, schema, l); err != nil || len(pending) != 0 {
				t.Fatalf("pending after the script: %v, %v; want none", pending, err)
			}
			if _, err := pool.Exec(ctx, `SELECT FROM victim`); err != nil {
				t.Fatalf("standard_conforming_strings %s, %q: the victim table is gone: %v\n%s", sc, name, err, script)
			}
		}
	}
}

// runScript runs script on a connection of its own with
// standard_conforming_strings set to sc.
func runScript(ctx context.Context, pool *pgxpool.Pool, sc, script string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Closed rather than returned to the pool: the script may have left it
	// in a failed transaction, and the setting must not outlive it.
	defer conn.Release()
	defer conn.Conn().Close(ctx)
	// A statement of its own, before: the server parses all of a script's
	// statements before it runs the first.
	if _, err := conn.Exec(ctx, "SET standard_conforming_strings = "+sc); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, script)
	return err
}
