// Package pg is the library's PostgreSQL plumbing, the bottom layer every
// other package stands on: DB, the interface through which everything
// reaches the server, and its optional capabilities (TxBeginner,
// Acquirer), used only on the types known to keep them consistent with
// DB's methods (Beginner, Pool); migrations (Line, Migrate,
// PendingMigrations, MigrationSQL); pooler detection (CheckPooling); the
// identifier checks; and the one configuration error (ConfigError,
// ErrInvalidConfig). It imports nothing else of the library.
package pg
