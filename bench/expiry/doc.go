// Package expiry measures the bloom strategy against idset side by side, on
// one PostgreSQL, at a size where idset's single marker index outgrows the
// database's buffers: Config.Markers live markers per strategy (10,000,000
// by default), spread over a retention of Config.Slices daily slices (7 by
// default), and fresh traffic of new keys claimed in batches of
// Config.Batch (500) per transaction.
//
// Run loads both tables directly (INSERT ... SELECT generate_series, with
// the indexes built after the rows, and for bloom into one partition per
// slice), then starts the bloom strategy as production does (Maintain, then
// Warm, which build its filters from the store), and measures:
//
//   - claim throughput of new keys, bloom and idset runs interleaved: the
//     median of Config.Runs, and the median of the runs' ratios;
//   - the cost of expiring the oldest slice's markers, alone on the
//     server after a checkpoint: the wall time and the WAL written
//     (pg_wal_lsn_diff of pg_current_wal_insert_lsn: the WAL generated,
//     written out yet or not) by bloom's Maintain dropping the slice's
//     partition, and by idset's Sweep deleting the same rows;
//   - the claim throughput while the next slice expires in another
//     goroutine, relative to the same strategy's steady state measured
//     just before and just after (bloom, whose drop lasts a fraction of the
//     window, drops Config.Drops slices this way; the median is reported);
//   - the bloom filters' memory per key and their measured false-positive
//     rate, from Stats.
//
// Expiry goes through each strategy's own code: a second bloom.Strategy on
// the same table whose Retention is one slice shorter sees the clock one
// slice later, so its Maintain detaches and drops the oldest partition;
// an idset.Strategy whose Retention ends just after the oldest slice sweeps
// exactly that slice's rows.
//
// cmd/expirytable runs it and prints the Markdown table BENCHMARKS.md shows.
package expiry
