// Package pgtest runs throwaway PostgreSQL servers for tests, benchmarks
// and runnable examples.
//
// A server is started from the machine's PostgreSQL binaries (initdb and
// pg_ctl, looked up in PATH and then in /usr/lib/postgresql/*/bin). It
// lives in a private temporary directory, listens only on a Unix socket in
// that directory and trusts every local connection, so several test
// binaries can run their own servers side by side. When the process runs
// as root, the server runs as the "postgres" operating system user, since
// PostgreSQL refuses to run as root.
//
// Most tests use the helpers, which share one lazily started server per
// test binary and give every test its own empty database:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		pool := pgtest.NewPool(t)
//		// ...
//	}
//
// Main stops the shared server when the tests are done. If the environment
// variable TEST_DATABASE_URL is set, no server is started: the helpers
// create (and afterwards drop) their databases on that server instead. If
// PGTEST_FSYNC=on, the shared server keeps fsync on, for benchmarks that
// should pay for durable commits.
//
// Start runs a separate server with explicit Options.
//
// # PgBouncer
//
// Production databases often sit behind PgBouncer in transaction pooling
// mode. NewBouncerPool gives a test a fresh database reached through a
// real PgBouncer (Debian's pgbouncer package, found in PATH or
// /usr/sbin), started on first use in front of the shared server with
// pool_mode = transaction and stopped by Main; BouncerURL gives its URL and
// SharedBouncer the PgBouncer itself. Like the server binaries, a missing
// pgbouncer binary fails the test with the command that installs it.
// StartBouncer runs a separate PgBouncer with explicit BouncerOptions (pool
// mode, pool size) in front of any server, in its own temporary directory,
// listening only on a Unix socket there.
//
// # Standbys and failover
//
// StartReplicated runs a primary and a streaming standby made with
// pg_basebackup, which a test kills, cuts off and promotes itself.
// StartPatroni (or NewPatroni, which skips a test when the binaries are
// missing) runs what production runs instead: two servers managed by
// Patroni (Debian's patroni package) with a throwaway etcd (etcd-server)
// as its store, on free TCP ports of 127.0.0.1. A test kills the leader's
// postgres (Patroni.Kill) and waits for Patroni to promote the standby
// (WaitLeader) and to make the old leader, rewound with pg_rewind, a
// standby of the new one (WaitStreaming); the application reaches
// whichever accepts writes through the multi-host URL (Patroni.URL).
package pgtest
