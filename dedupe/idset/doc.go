// Package idset is the processed-ID dedupe strategy: a table of markers
// keyed by (scope, id), one row per message processed.
//
// Claim writes the markers of a whole batch in one statement,
//
//	INSERT … SELECT FROM unnest($scopes, $ids, $fingerprints)
//	ON CONFLICT DO NOTHING RETURNING …
//
// joined with the markers that existed before it, which gives every key its
// verdict: new (inserted), duplicate (a marker exists) or mismatch (a marker
// exists with another payload fingerprint). The primary key makes a second
// transaction claiming the same key wait for the first and then see its
// outcome; in that rare case one more statement reads the fingerprints of
// the markers the other transaction committed. Keys are inserted in sorted
// order, so overlapping batches cannot deadlock.
//
// Markers expire after Config.Retention. The sweeper (Sweep, or RunSweeper
// in a goroutine) deletes expired markers in small batches, each its own
// short transaction, using the index on processed_at. Retention must be
// longer than the source's redelivery horizon; New warns when
// Config.RedeliveryHorizon says it is not.
//
// The table is created by embedded, numbered migrations, handed out by
// Migrations: a consumer's Migrate applies them, pg.Migrate applies them
// together with other lines, and pg.MigrationSQL prints them for a DBA.
// Schema and table names are configurable and always quoted.
package idset
