package pg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultSchema is the schema the library's tables live in unless configured otherwise.
const DefaultSchema = "effectively"

// Migrations have one entry point, the same in code and in the CLI.
//
// Everything that owns tables hands out its migration lines: a strategy
// or a source through Migrator (Migrations), the parked table through
// parked.Line (package consumer/parked), the Kafka offsets table through
// kafka.OffsetsLine,
// and a consumer.Consumer, for everything it uses (parked table, its
// strategy's and its source's tables), through Consumer.Migrations. Three
// functions take those lines and a schema for the migrations table:
//
//   - Migrate applies the migrations not yet applied, under a lock;
//   - PendingMigrations lists them without applying anything;
//   - MigrationSQL prints them all as one script for a DBA to review and
//     run by hand, after which Migrate applies nothing.
//
// Consumer.Migrate is Migrate over Consumer.Migrations, and the CLI's
// "migrate" (--print for MigrationSQL) runs the same functions over the
// same lines, built from its flags.

// Line is one sequence of numbered migrations, such as the tables of one
// strategy. Files in FS are named NNN_description.sql and applied in order of
// NNN. In their text, {{name}} is replaced by the quoted identifier
// Idents[name]. "schema" is always available: it is the schema given to
// Migrate unless Idents["schema"] names the line's own schema, which Migrate
// then creates when missing.
type Line struct {
	// Name identifies the line in the migrations table, e.g. "idset:processed".
	Name string
	// FS holds the .sql files.
	FS fs.FS
	// Idents maps placeholder names to raw identifiers, quoted when rendered.
	Idents map[string]string
}

// Migration is one rendered migration file.
type Migration struct {
	Line    string
	Version int
	Name    string
	SQL     string
}

var migrationFile = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.sql$`)
var placeholder = regexp.MustCompile(`\{\{([a-z_]+)\}\}`)

// Render returns the line's migrations in order, with identifiers quoted for schema.
// It returns an error when the schema, an identifier of Idents or the
// line's Name holds a character ValidateIdentifier refuses (a control
// character, say): such a name could not be shown in a script's comments
// or read back as what it is.
func (l Line) Render(schema string) ([]Migration, error) {
	if err := l.checkNames(schema); err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(l.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("pg: reading migrations of %s: %w", l.Name, err)
	}
	idents := map[string]string{"schema": schema}
	for k, v := range l.Idents {
		idents[k] = v
	}
	var out []Migration
	for _, e := range entries {
		m := migrationFile.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(l.FS, path.Join(".", e.Name()))
		if err != nil {
			return nil, err
		}
		var missing string
		text := placeholder.ReplaceAllStringFunc(string(body), func(s string) string {
			name := s[2 : len(s)-2]
			id, ok := idents[name]
			if !ok {
				missing = name
				return s
			}
			return pgx.Identifier{id}.Sanitize()
		})
		if missing != "" {
			return nil, fmt.Errorf("pg: migration %s/%s uses unknown placeholder {{%s}}", l.Name, e.Name(), missing)
		}
		out = append(out, Migration{Line: l.Name, Version: v, Name: m[2], SQL: text})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// checkNames checks the names l writes into SQL by ValidateIdentifier's
// rule, their length aside: a longer name was always truncated by the
// server, and refusing it now would strand the tables made with it.
func (l Line) checkNames(schema string) error {
	if err := printable(l.Name); err != nil {
		return fmt.Errorf("pg: migration line name: %w", err)
	}
	if err := printable(schema); err != nil {
		return fmt.Errorf("pg: migration line %s: schema: %w", l.Name, err)
	}
	for _, k := range slices.Sorted(maps.Keys(l.Idents)) {
		if err := printable(l.Idents[k]); err != nil {
			return fmt.Errorf("pg: migration line %s: {{%s}}: %w", l.Name, k, err)
		}
	}
	return nil
}

// checkLines checks every name lines and schema write into SQL, before
// anything is written or run.
func checkLines(schema string, lines []Line) error {
	for _, l := range lines {
		if err := l.checkNames(schema); err != nil {
			return err
		}
	}
	return nil
}

// Migrate applies the migrations of lines that are not yet applied, in one
// transaction, holding an advisory lock so that processes starting together
// do not race. It creates schema and its migrations table when missing.
// It returns the migrations it applied.
//
// The lock is transaction-level (pg_advisory_xact_lock), so Migrate works
// through a pooler in transaction mode such as PgBouncer's. Before anything
// else it runs CheckPooling and refuses, with ErrTransactionPooling and the
// setting to change, a db whose pgx connections keep named prepared
// statements (pgx's default) behind a transaction pooler: the consumer and
// the relay would fail through it.
func Migrate(ctx context.Context, db DB, schema string, lines ...Line) ([]Migration, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := checkLines(schema, lines); err != nil {
		return nil, err
	}
	p, err := CheckPooling(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("pg: migrate: %w", err)
	}
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("pg: migrate: %w", err)
	}
	for attempt := 1; ; attempt++ {
		applied, err := migrateOnce(ctx, db, schema, lines)
		if err == nil || attempt == migrateAttempts || !catalogRace(err) {
			return applied, err
		}
	}
}

// migrateAttempts bounds the runs of Migrate's transaction that a
// catalogRace rolls back.
const migrateAttempts = 3

// catalogRace reports whether err is a unique violation in a system
// catalog, which a CREATE … IF NOT EXISTS raises when it raced another
// transaction's CREATE: a backend that looked the name up before the
// winner committed (a pooled server connection that ran
// PendingMigrations, say) may still hold the miss in its catalog cache
// after waiting for the lock, and tries to create the object again. A new
// transaction sees the object.
func catalogRace(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" &&
		(pe.SchemaName == "pg_catalog" || strings.HasPrefix(pe.ConstraintName, "pg_"))
}

func migrateOnce(ctx context.Context, db DB, schema string, lines []Line) ([]Migration, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pg: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('effectively.migrate'))`); err != nil {
		return nil, fmt.Errorf("pg: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, preamble(schema)); err != nil {
		return nil, fmt.Errorf("pg: migrate: %w", err)
	}
	table := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	var applied []Migration
	for _, l := range lines {
		ms, err := l.Render(schema)
		if err != nil {
			return nil, err
		}
		if own := l.Idents["schema"]; own != "" && own != schema {
			if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{own}.Sanitize()); err != nil {
				return nil, fmt.Errorf("pg: migrate: %w", err)
			}
		}
		var current int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+table+` WHERE line = $1`, l.Name).Scan(&current); err != nil {
			return nil, fmt.Errorf("pg: migrate: %w", err)
		}
		for _, m := range ms {
			if m.Version <= current {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return nil, fmt.Errorf("pg: migration %s %03d_%s: %w", m.Line, m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (line, version, name) VALUES ($1, $2, $3)`, m.Line, m.Version, m.Name); err != nil {
				return nil, fmt.Errorf("pg: migrate: %w", err)
			}
			applied = append(applied, m)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("pg: migrate: commit: %w", err)
	}
	return applied, nil
}

// PendingMigrations returns the migrations of lines that Migrate would
// apply to db now, in the order it would apply them, without applying
// anything.
func PendingMigrations(ctx context.Context, db DB, schema string, lines ...Line) ([]Migration, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := checkLines(schema, lines); err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pg: pending migrations: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	table := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		return nil, fmt.Errorf("pg: pending migrations: %w", err)
	}
	current := map[string]int{}
	if exists {
		rows, err := tx.Query(ctx, `SELECT line, max(version) FROM `+table+` GROUP BY line`)
		if err != nil {
			return nil, fmt.Errorf("pg: pending migrations: %w", err)
		}
		var l string
		var v int
		if _, err := pgx.ForEachRow(rows, []any{&l, &v}, func() error { current[l] = v; return nil }); err != nil {
			return nil, fmt.Errorf("pg: pending migrations: %w", err)
		}
	}
	var out []Migration
	for _, l := range lines {
		ms, err := l.Render(schema)
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			if m.Version > current[l.Name] {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

func preamble(schema string) string {
	s := pgx.Identifier{schema}.Sanitize()
	t := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	return `CREATE SCHEMA IF NOT EXISTS ` + s + `;
CREATE TABLE IF NOT EXISTS ` + t + ` (
    line       text        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (line, version)
);`
}

// MigrationSQL renders every migration of lines as one script a DBA can
// review and run by hand; it records each version in the migrations table
// just as Migrate does, so Migrate later skips them. Like Migrate, it
// refuses a schema, identifier or line name holding a character
// ValidateIdentifier refuses; every name it writes is quoted as an
// identifier or a literal, or shown in a comment that no name can end.
func MigrationSQL(schema string, lines ...Line) (string, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := checkLines(schema, lines); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("BEGIN;\n\n")
	b.WriteString(preamble(schema))
	b.WriteString("\n")
	table := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	for _, l := range lines {
		ms, err := l.Render(schema)
		if err != nil {
			return "", err
		}
		if own := l.Idents["schema"]; own != "" && own != schema {
			fmt.Fprintf(&b, "\nCREATE SCHEMA IF NOT EXISTS %s;\n", pgx.Identifier{own}.Sanitize())
		}
		for _, m := range ms {
			body := strings.TrimSpace(m.SQL)
			if !strings.HasSuffix(body, ";") {
				body += "\n;" // a last statement without one (or a comment) ends here
			}
			fmt.Fprintf(&b, "\n-- %s %03d_%s\n%s\n", commentText(m.Line), m.Version, commentText(m.Name), body)
			fmt.Fprintf(&b, "INSERT INTO %s (line, version, name) VALUES (%s, %d, %s) ON CONFLICT DO NOTHING;\n",
				table, quoteLiteral(m.Line), m.Version, quoteLiteral(m.Name))
		}
	}
	b.WriteString("\nCOMMIT;\n")
	return b.String(), nil
}

// quoteLiteral quotes s as a SQL string literal that reads the same
// whatever standard_conforming_strings says: when s holds a backslash, as
// an escape string (E'…') with the backslashes doubled, as PostgreSQL's
// quote_literal writes it; a plain '…' would let a backslash escape the
// closing quote where the setting is off.
func quoteLiteral(s string) string {
	q := strings.ReplaceAll(s, "'", "''")
	if strings.Contains(s, `\`) {
		return "E'" + strings.ReplaceAll(q, `\`, `\\`) + "'"
	}
	return "'" + q + "'"
}

// commentText is s as it may stand in a -- comment: as it is when every
// character is printable, else quoted with Go's escapes (strconv.Quote), so
// that no newline or carriage return, which end the comment, and no
// invisible character reaches the script. It keeps a comment a comment
// whatever the names checked before it.
func commentText(s string) string {
	if printable(s) != nil {
		return strconv.Quote(s)
	}
	return s
}
