// Package kafka is a consumer.Source over a Kafka consumer group, built on
// segmentio/kafka-go: its ConsumerGroup and Generation API for membership
// and assignments, and its protocol layer (Fetch requests sent through a
// kafka-go Transport, with Config.TLS, Config.SASL, Config.ClientID and
// Config.DialTimeout) to read the partitions.
//
// Every assigned partition is a lane: partitions are processed in parallel,
// records of one partition in offset order, and a partition never has more
// than one batch in flight.
//
// # Offsets in Postgres
//
// By default the position of every partition lives in a Postgres table,
// (group, topic, partition) → next offset, generation, written by
// BeforeCommit inside the batch's transaction. So the position moves exactly
// when the batch's effects commit, and a crash between that commit and the
// Kafka offset commit does not deliver the batch again.
//
// When a generation is assigned a partition it claims the partition's row
// (raising its generation) and seeks to the stored offset, falling back to
// the offset committed to Kafka and then to Config.StartOffset. A consumer
// of an older generation (a zombie that missed a rebalance) can then no
// longer write the row: its BeforeCommit fails with an error wrapping
// consumer.ErrFenced, the transaction rolls back, and its batch leaves no
// effect. The claim takes the row lock, so it waits for a zombie's
// transaction already past BeforeCommit and reads what it committed.
//
// The next offset stored is the first offset not yet settled: a message
// handed back for a retry holds it back, while later messages of the
// partition go on; if the consumer stops before the retry committed, the
// later messages are delivered again and the dedupe strategy reports them
// as duplicates.
//
// Offsets are also committed to Kafka after each transaction (for lag
// monitoring and tooling), never past what committed in Postgres. The offset
// in Postgres wins: to move a group's position (skip or replay records),
// update next_offset in the table while the group is stopped; an offset
// reset done with Kafka's tools is ignored for partitions that have a row. With
// Config.KafkaOffsetsOnly they are the only position: there is no fencing,
// and redeliveries are left to the dedupe strategy.
//
// Generation IDs are compared as numbers: if the group is deleted on the
// brokers and its generations start again from 1, delete the group's rows
// from the offsets table (the source logs an error naming the partitions it
// refuses to consume).
//
// # Rebalances
//
// When a generation ends, no more batches of its partitions are handed out;
// batches in flight may still commit for up to Config.RevokeTimeout, after
// which they are abandoned (their commit is refused and nothing is
// acknowledged for them). Close abandons at once.
//
// # TLS and SASL
//
// Config.TLS and Config.SASL apply to every connection the source makes.
// For a cluster with a private CA and mutual TLS:
//
//	ca := x509.NewCertPool()
//	ca.AppendCertsFromPEM(caPEM)
//	cert, err := tls.LoadX509KeyPair("client.crt", "client.key")
//	...
//	cfg.TLS = &tls.Config{RootCAs: ca, Certificates: []tls.Certificate{cert}}
//	cfg.SASL, err = kafka.SASLMechanism("SCRAM-SHA-512", user, os.Getenv("KAFKA_PASSWORD"))
//
// When the brokers refuse the credentials (a wrong password, an unknown
// user or mechanism) or the TLS handshake fails on a certificate (not
// signed by a trusted CA, not valid for the broker's name, a client
// certificate missing or refused), Fetch returns an error that matches
// ErrAuthentication and is permanent: the consumer's Run stops with it
// rather than retrying a connection that cannot succeed. Other connection
// failures (an unreachable broker, a timeout) are retried, and
// consumer.Config.SourceFailureTimeout bounds them.
//
// # Messages
//
// Message.ID is the value of the Config.IDHeader header ("idempotency-key"
// by default), or "topic/partition/offset" when it is missing or empty;
// Message.Ref is "topic/partition@offset", Message.Lane "topic/partition",
// Message.Key the record key. SequenceKey is a KeyFunc for the highwater
// strategy, reading a sender and a sequence number from headers (parsed by
// highwater's rule). Position tells a message's topic, partition and
// offset.
//
// # Redelivery and attempts
//
// Retried messages are kept by the source and delivered again after their
// delay; abandoned ones at once. Once due, they come before the partition's
// records not yet delivered, in offset order, while the records after a
// retried one go on meanwhile (the source does not hold the partition back).
//
// Message.Attempt counts deliveries as consumer.Source defines it, as far
// as Kafka allows: Kafka keeps no delivery count, so the source counts its
// own. It carries the count across rebalances (a partition revoked and
// assigned to the same Source again goes on counting for the records it
// had delivered and not seen committed), but not across processes: a new
// Source, or another consumer taking the partition over, starts again at 1.
// Config.MaxAttempts of the consumer therefore bounds the attempts of a
// failing message within one process; a message that crashes the process
// is never counted out.
//
// Settle never talks to Kafka: the position commits in the batch's
// transaction (BeforeCommit), and the offset commit to Kafka that follows
// is asynchronous, its failures logged (with Config.KafkaOffsetsOnly a
// lost commit means a redelivery, which the dedupe strategy resolves). So
// Settle returns nil, also for a batch of a partition this consumer no
// longer owns, whose records the partition's owner delivers again.
//
// # Transactions
//
// Records written by transactional producers are read with read-committed
// isolation by default: only records of committed transactions, and
// records of producers that use no transactions, are delivered. A record
// of an aborted transaction applied would be an effect of something that
// never happened. Config.ReadUncommitted also delivers the records of
// aborted transactions, and those of open ones as soon as they are written.
//
// The broker leaves part of that work to the client, so the source reads
// the record batches itself: control records (the commit and abort markers
// that end every transaction) are never delivered, under any isolation,
// and under read-committed the batches of aborted transactions are dropped
// as Kafka's Java consumer drops them, from the aborted transactions the
// broker lists with every fetch (a producer's batches count as aborted from
// its transaction's first offset until its abort marker). Under
// read-committed the broker returns nothing past the first offset of the
// oldest transaction still open on the partition, so an open transaction
// holds the partition back until it ends.
//
// Dropped records are settled like delivered ones, without reaching the
// consumer: a partition's commit point moves past the records dropped after
// a delivered record as soon as that record settles, and past dropped
// records at the end of what was fetched (a partition whose last records
// are markers or an aborted transaction) once nothing before them is in
// flight, waiting for a retry or buffered. The source then stores that
// offset in the offsets table in a transaction of its own, fenced by the
// generation like BeforeCommit, so a restart does not fetch those records
// again and Lag reaches 0. Offsets, and Message.Ref, still count every
// record, so the offsets of delivered messages can have gaps.
//
// Batches compressed with gzip, snappy, lz4 or zstd are decoded with
// kafka-go's codecs.
//
// # Null and empty values
//
// Kafka tells a null value (a tombstone: on a compacted topic, "delete this
// key") from an empty one, a null key from an empty key, and a null header
// value from an empty one. So does this source: a null arrives as nil
// (Message.Value, Message.Key, a header's Value), an empty one as a non-nil
// empty slice. The consumer engine keeps nil and empty apart everywhere
// after the source (handler, parked table, redrive), so a handler of a
// compacted topic can test m.Value == nil for a tombstone. The dedupe
// fingerprint (dedupe.Fingerprint) hashes the value's bytes, so a null and
// an empty value have the same fingerprint: a redelivery stays a
// duplicate, not a mismatch, also of a record delivered by a version of the
// source that did not tell them apart.
//
// # Offsets out of range
//
// A partition whose position lies before the start of its log (retention
// deleted the records) moves on to the first offset the log still has,
// with a warning naming how many offsets were skipped. A partition whose
// stored offset lies past the end of its log (the topic was deleted and
// recreated) is not reset: the source keeps fetching from that offset and
// logs warnings. Delete the group's rows from the offsets table to start
// such a partition over.
package kafka
