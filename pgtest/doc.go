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
package pgtest
