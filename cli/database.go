package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// envDatabaseURL is the environment variable of the database URL, read
// before $DATABASE_URL: the tool can be pointed at a database without
// touching the DATABASE_URL an application's environment already holds.
const envDatabaseURL = "EFFECTIVELY_DATABASE_URL"

// databaseHelp documents where the database URL comes from.
const databaseHelp = `Connecting to PostgreSQL: the URL comes from --database-url, or from the
file named by --database-url-file (its trailing newline removed), or from
$` + envDatabaseURL + `, or from $DATABASE_URL, in that order. A password on
the command line is shown by ps and kept in the shell history: put the URL in
a file or the environment, or leave the password out of the URL and give it
in $PGPASSWORD or ~/.pgpass, which the driver reads as psql does.`

// databaseURL returns the URL to connect to and where it came from.
func (a *app) databaseURL() (dbURL, from string, err error) {
	switch {
	case a.dbURL != "" && a.dbURLFile != "":
		return "", "", errors.New("the database URL is given twice: by --database-url and by --database-url-file; give one")
	case a.dbURL != "":
		if hasPassword(a.dbURL) {
			fmt.Fprintf(a.stderr(), "warning: --database-url holds a password, which ps and the shell history show: "+
				"use --database-url-file, $%s, $PGPASSWORD or ~/.pgpass instead\n", envDatabaseURL)
		}
		return a.dbURL, "--database-url", nil
	case a.dbURLFile != "":
		b, err := os.ReadFile(a.dbURLFile)
		if err != nil {
			return "", "", fmt.Errorf("--database-url-file: %w", err)
		}
		u := strings.TrimRight(string(b), "\r\n")
		if strings.TrimSpace(u) == "" {
			return "", "", fmt.Errorf("--database-url-file: %s is empty", a.dbURLFile)
		}
		return u, "--database-url-file", nil
	}
	for _, env := range []string{envDatabaseURL, "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			return u, "$" + env, nil
		}
	}
	return "", "", fmt.Errorf("no database: set --database-url-file, $%s or $DATABASE_URL (or --database-url)", envDatabaseURL)
}

// keywordPassword finds a password in a keyword/value connection string.
var keywordPassword = regexp.MustCompile(`(^|\s)password\s*=`)

// hasPassword reports whether a connection string carries a password.
func hasPassword(s string) bool {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		if err != nil {
			return false
		}
		_, set := u.User.Password()
		return set || u.Query().Has("password")
	}
	return keywordPassword.MatchString(s)
}

func (a *app) stderr() io.Writer {
	if a.errOut != nil {
		return a.errOut
	}
	return os.Stderr
}

// db connects on first use.
func (a *app) db(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	dbURL, from, err := a.databaseURL()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("database (%s): %w", from, err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", connectError(cfg.ConnConfig.Config, err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database: %w", connectError(cfg.ConnConfig.Config, err))
	}
	a.pool = pool
	return pool, nil
}

// connectError drops, from a failed connection's errors, those of the TLS
// attempts when TLS was not required (sslmode=prefer or allow, prefer
// being the default): the driver then tried without TLS too, and that
// attempt's error (a refused password, say) is the one that tells what is
// wrong. When TLS was required, or every attempt failed on TLS, the error
// is returned as it is.
func connectError(cfg pgconn.Config, err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
	}
	joined, ok := ce.Unwrap().(interface{ Unwrap() []error })
	if !ok || !tlsOptional(cfg) {
		return err
	}
	all := joined.Unwrap()
	var kept []error
	for _, e := range all {
		if !strings.Contains(e.Error(), "tls error: ") {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 || len(kept) == len(all) {
		return err
	}
	msg := make([]string, len(kept))
	for i, e := range kept {
		msg[i] = e.Error()
	}
	return &attemptsError{
		msg: fmt.Sprintf("failed to connect to `user=%s database=%s`: %s", cfg.User, cfg.Database, strings.Join(msg, "; ")),
		err: errors.Join(kept...),
	}
}

// tlsOptional reports whether a connection may be made without TLS.
func tlsOptional(cfg pgconn.Config) bool {
	if cfg.TLSConfig == nil {
		return true
	}
	for _, fb := range cfg.Fallbacks {
		if fb.TLSConfig == nil {
			return true
		}
	}
	return false
}

// attemptsError is a connection's failure without its optional TLS
// attempts; errors.Is and errors.As see the attempts kept.
type attemptsError struct {
	msg string
	err error
}

func (e *attemptsError) Error() string { return e.msg }
func (e *attemptsError) Unwrap() error { return e.err }

// explain adds to a command's error what to do about it when the
// database says the library's tables or schema are missing.
func (a *app) explain(err error) error {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "42P01", "3F000": // undefined_table, invalid_schema_name
		return fmt.Errorf("%w\nThe library's tables are not in this database under --schema %s: run %q to create them "+
			"(with --kafka, --outbox or --idempotency for those tables), or give the --schema and table names the consumers use",
			err, showRef(a.schema), a.opts.Name+" migrate")
	}
	return err
}
