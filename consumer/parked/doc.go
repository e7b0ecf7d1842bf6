// Package parked owns the parked table, the dead-letter table in
// PostgreSQL where a message that failed permanently or too often is kept
// whole, with why it was parked and how often, until it is looked at,
// redriven or purged. Every statement on the table is a method of [Store];
// [Row] is the one shape of a parked message; [Line] hands out the table's
// migrations.
//
// A consumer parks its messages in the batch's transaction through
// [Store.InsertTx], and consumer.Redrive takes them back out with
// [Store.TakeTx]; operators list, count and purge rows through
// consumer.Consumer.Parked or [NewStore].
package parked
