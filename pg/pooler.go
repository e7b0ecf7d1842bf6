package pg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrTransactionPooling is returned (wrapped, with the setting to change)
// when the connections go through a pooler in transaction pooling mode,
// such as PgBouncer with pool_mode = transaction, and the pgx connection
// configuration would break through it: named prepared statements
// (pgx.QueryExecModeCacheStatement, pgx's default, or
// pgx.QueryExecModeDescribeExec) live on one server connection, and the
// pooler hands the next transaction another one.
var ErrTransactionPooling = errors.New("connection pooler in transaction mode")

// Pooling is what CheckPooling saw between a connection and the server.
type Pooling struct {
	// Pooler is true when a pooler stands between: the process ID the
	// client was told at connection (PgBouncer hands out its own) is not
	// the server's pg_backend_pid().
	Pooler bool
	// Transaction is true when the pooler was seen handing one server
	// connection to two client connections in turn, while the first stayed
	// connected: transaction (or statement) pooling. It is only ever seen
	// with a *pgxpool.Pool, and may go unseen under load; Pooler alone then
	// says that the pool mode is not known.
	Transaction bool
	// ExecMode is the pgx connections' DefaultQueryExecMode.
	ExecMode pgx.QueryExecMode
}

// NamedStatements reports whether ExecMode keeps named prepared statements
// on a server connection from one transaction to the next, which a
// transaction pooler cannot carry.
func (p Pooling) NamedStatements() bool {
	return p.ExecMode == pgx.QueryExecModeCacheStatement || p.ExecMode == pgx.QueryExecModeDescribeExec
}

// Err is ErrTransactionPooling, with the fix, when transaction pooling was
// seen and ExecMode keeps named prepared statements; otherwise nil.
func (p Pooling) Err() error {
	if p.Transaction && p.NamedStatements() {
		return fmt.Errorf("%w, and pgx's %s mode keeps prepared statements on a server connection from one round trip to the next, which the pooler hands to another client in between (\"prepared statement ... does not exist\"); "+
			"set pgxpool.Config.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec (or QueryExecModeCacheDescribe), "+
			"or default_query_exec_mode=exec in the connection string, or use pool_mode = session", ErrTransactionPooling, p.ExecMode)
	}
	return nil
}

// Warning says what may break when a pooler was seen but not its mode and
// ExecMode keeps named prepared statements; otherwise it is "". Callers
// with a logger log it at start-up.
func (p Pooling) Warning() string {
	if p.Pooler && !p.Transaction && p.NamedStatements() {
		return fmt.Sprintf("the connections go through a pooler (the server's process ID is not the one the client was told) and pgx's %s mode keeps prepared statements on a server connection: "+
			"fine with pool_mode = session, but in transaction pooling they break; there set DefaultQueryExecMode = pgx.QueryExecModeExec (default_query_exec_mode=exec in the connection string)", p.ExecMode)
	}
	return ""
}

// probeRounds is how many times CheckPooling looks for a shared server
// connection before it leaves the pool mode unknown.
const probeRounds = 10

// CheckPooling finds out whether db reaches the server through a pooler,
// and whether that pooler pools transactions (see Pooling). It runs a few
// simple-protocol queries (no prepared statement is left behind) on one
// connection, or on two when db is a *pgxpool.Pool. Migrate runs it and
// returns Pooling.Err; a long-running component calls it at start-up.
func CheckPooling(ctx context.Context, db DB) (Pooling, error) {
	var p Pooling
	tx, err := db.Begin(ctx)
	if err != nil {
		return p, fmt.Errorf("pg: checking for a pooler: %w", err)
	}
	conn := tx.Conn()
	p.ExecMode = conn.Config().DefaultQueryExecMode
	told := conn.PgConn().PID()
	var server uint32
	err = tx.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&server)
	_ = tx.Rollback(context.WithoutCancel(ctx))
	if err != nil {
		return p, fmt.Errorf("pg: checking for a pooler: %w", err)
	}
	p.Pooler = told != server
	pool := Pool(db)
	if !p.Pooler || pool == nil || pool.Config().MaxConns < 2 {
		return p, nil
	}
	for range probeRounds {
		shared, err := sharesServer(ctx, pool)
		if err != nil {
			return p, fmt.Errorf("pg: checking the pooler's mode: %w", err)
		}
		if shared {
			p.Transaction = true
			break
		}
	}
	return p, nil
}

// sharesServer holds one client connection, idle outside a transaction,
// while a second runs a statement, and reports whether both statements ran
// on the same server connection. A session pooler pins a server connection
// to its client until the client leaves, so that cannot happen there.
func sharesServer(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	a, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer b.Release()
	var pa, pb uint32
	if err := a.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&pa); err != nil {
		return false, err
	}
	if err := b.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&pb); err != nil {
		return false, err
	}
	return pa == pb, nil
}
