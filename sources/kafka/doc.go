// Package kafka is a consumer.Source over a Kafka consumer group, built on
// segmentio/kafka-go: its ConsumerGroup and Generation API for membership
// and assignments, and its protocol layer (Fetch requests sent through a
// kafka-go Transport, with Config.TLS, Config.SASL, Config.ClientID and
// Config.DialTimeout) to read the partitions.
//
// Every assigned partition is a lane: partitions are processed in parallel,
// records of one partition in offset order, and a partition has one batch
// in flight, or, with Config.Pipeline, two while the first commits (below).
//
// # Pipelined partitions
//
// With Config.Pipeline, and run by a consumer (which implements
// consumer.PipelineSource's side of it), a partition's next batch is
// handed out as soon as the last one's
// offset is written in its transaction, before its COMMIT, when one of the
// consumer's goroutines is free (consumer.Config.Concurrency above the
// number of busy partitions; give the pool a connection for each). That
// batch claims its keys while the first commits (a sequenced strategy
// such as highwater waits first, since its verdicts depend on the commit
// before), then waits: its handlers run, and its offset is written, only
// once the first was settled with every message acknowledged or retried
// after a delay, so they see what the first wrote and commit after it.
// When the first did not commit whole (rolled back, fenced, abandoned, or
// run again after a refused COMMIT), the second rolls back and its
// records are delivered again after the first's, in offset order; its
// handlers may have run once in the rolled-back transaction. The offset
// committed to Kafka and the one stored in Postgres never pass a record
// of either batch before it committed.
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
// the offset committed to Kafka and then to Config.StartOffset. The
// offsets the source commits to Kafka carry metadata: that they followed a
// Postgres commit, and the partition's origin (where the group first
// consumed it with its offsets in Postgres). A partition with no stored
// offset whose Kafka commit carries it lost its row with the database's
// last commits (an asynchronous failover, a restore), and its effects and
// markers with it: the source consumes it again from its origin, not from
// the offset in Kafka (docs/failover.md). Each batch also stores the
// offset after its highest committed record (high_offset), which moves
// while a retried message holds the next offset back: a running consumer
// whose write finds either offset lower than it stored (the database lost
// commits) drops the batch and rejoins, consuming again from the stored
// offset; a lane with nothing more to consume is checked against the table
// once a second. A consumer
// of an older generation (a zombie that missed a rebalance) can then no
// longer write the row: its BeforeCommit fails with an error wrapping
// consumer.ErrFenced, the transaction rolls back, and its batch leaves no
// effect. A row locked by a transaction in progress (a batch of the
// previous owner past BeforeCommit, not yet committed) is not waited for:
// the partitions whose rows are free start at once, and the locked ones
// are claimed again, after 50ms doubling up to 1s, until the transaction
// ended; then the claim reads what it committed.
//
// # A frozen worker
//
// A worker that freezes (stopped, a long GC pause, a lost host) in the
// middle of a batch holds its transaction open, and with it the markers
// its claim took and, once past BeforeCommit, its partition's offsets row.
// Other partitions never wait for it: claims at assignment skip locked
// rows, so the new owner of the partitions the frozen worker did not lock
// consumes them as soon as the group has rebalanced, and claims the locked
// one again (after 50ms, doubling up to 1s) until it is free. The consumer
// bounds how long that is: it sets PostgreSQL's
// idle_in_transaction_session_timeout to consumer.Config.IdleTxTimeout
// (10s by default) in every batch transaction, so the server ends the
// frozen session, rolls its transaction back and releases its locks
// IdleTxTimeout after the freeze began. The coordinator drops the frozen
// member after SessionTimeout; so a partition stalls behind a frozen
// worker for about max(SessionTimeout, IdleTxTimeout) + 1s, plus the
// rebalance (see Failover). When the worker wakes, its commit fails (its
// session is gone) and its retry of the batch is fenced: nothing is
// applied twice. With a negative IdleTxTimeout the server's setting
// applies, and the partition waits as long as the freeze lasts. A worker
// frozen while claiming its partitions (between the claim's statement and
// its COMMIT) holds their rows locked too: the claim's transaction sets
// idle_in_transaction_session_timeout to 5s, whatever IdleTxTimeout is,
// so the server ends it within the same bound.
//
// The same bound holds for a worker frozen in its COMMIT. If the COMMIT
// had not reached the server, the transaction is still open and idle, the
// server ends it IdleTxTimeout after the freeze, and the worker reads, when
// it wakes, the server's answer that it did so (SQLSTATE 25P03; over a Unix
// socket its COMMIT cannot even be sent): the COMMIT never ran, so the batch is reported rolled back (BatchStats.Err) and
// nothing of it is acknowledged; the partition's new owner has consumed its
// records meanwhile. If the server had run the COMMIT, the locks were
// released with it: the partition moves after SessionTimeout plus the
// rebalance, its new owner starts after the committed batch, and the woken
// worker reports the batch applied; the offset it then commits to Kafka
// carries its old generation, which the coordinator refuses, and its next
// batch is fenced. Either way each record has one effect.
// TestFrozenInCommit stops a worker process (SIGSTOP) at its COMMIT: with
// SessionTimeout 6s and IdleTxTimeout 15s the locked partition moved after
// about 16s (and the others after about 6s), or 5s when the COMMIT had run.
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
// # Failover
//
// A worker that stops without leaving the group (kill -9, a crash, a lost
// host) keeps its partitions until the coordinator's session timeout
// expires. Then the coordinator rebalances the group: the others notice on
// their next heartbeat, let their in-flight batches finish (up to
// Config.RevokeTimeout) and rejoin, and the new owners claim the dead
// worker's partitions. So they stall for about Config.SessionTimeout +
// Config.HeartbeatInterval + the survivors' in-flight batches, and at most
// SessionTimeout + Config.RebalanceTimeout when a survivor is slow to
// rejoin (the coordinator drops it then). With the defaults (10s, 1s, 30s)
// that is about 11s, measured with kfake (TestFailoverAfterKill), and at
// most 40s. The dead worker's open transactions end when PostgreSQL sees
// its connections close (for a host that is gone, after
// consumer.Config.IdleTxTimeout at the latest), so they hold no offsets row
// or marker by then.
//
// The session timeout is a trade-off: a shorter one fails over sooner, but
// a worker whose heartbeats pause for longer (a stopped process, a long GC
// or scheduling pause, a network hiccup) is dropped from the group, and the
// rebalance that follows pauses every partition of the group for up to
// RevokeTimeout. Brokers accept session timeouts between
// group.min.session.timeout.ms and group.max.session.timeout.ms (6s and 30
// minutes by default). Heartbeats run on their own goroutine, so a slow
// handler does not miss them. A worker that leaves in an orderly way
// (Close) leaves the group (kafka-go sends LeaveGroup), the others notice
// on their next heartbeat and rejoin, and its partitions move within
// about a HeartbeatInterval plus an eager rebalance, in which the others'
// partitions pause too: about 0.2s with a 200ms HeartbeatInterval
// (TestCleanStopHandsOver).
//
// kafka-go's groups have no static membership (KIP-345; its ConsumerGroup
// joins with an old JoinGroup version and sends no group instance ID): a
// killed worker restarted at once joins as a new member, and the rebalance
// that admits it waits for the dead member until its session expires (or
// the rebalance timeout passes), so a kill costs its partitions the
// session timeout however quickly the worker comes back, and every kill
// pauses the whole group (an eager rebalance).
// For restarts that take their partitions back at once, use sources/franz
// with its Config.InstanceID (static membership, cooperative rebalances):
// over the chaos run's kill storm (make chaos-storm) it kept 95% of
// its calm throughput where this source kept 17% (medians of three runs).
//
// # Rebalance hooks
//
// Config.OnAssigned is called with the partitions a generation claimed,
// after the claim in Postgres and before any of their batches is handed
// out (partitions whose offsets row was locked come in a later call, once
// claimed). Config.OnRevoked is called when the generation ended, after
// the in-flight batches of its partitions committed or were abandoned, and
// before the member rejoins the group, so before another member is given
// them in an orderly rebalance (a member the coordinator already dropped
// may be called later; the Postgres fence keeps its batches out). They
// are called from the generation's goroutine: they must return promptly,
// and a slow OnRevoked delays the rebalance of the whole group.
//
// # Topics and partitions that change
//
// The source reads the metadata of Config.Topics every
// Config.MetadataInterval (10s by default). A topic that does not exist is
// logged as a warning naming it, again every five minutes while it stays
// so, and the group consumes the other topics meanwhile. (A topic the
// credentials may not read is logged the same way, but kafka-go's group
// leader then fails to join the group, which Fetch reports.) The member that computed the group's assignment
// (the group's leader) rejoins the group when the metadata changed since:
// a topic was created or deleted, or partitions were added. The coordinator
// then rebalances the group, so new topics and partitions are consumed
// within about MetadataInterval plus a rebalance (HeartbeatInterval plus
// the members' in-flight batches, see "Failover").
// The group's leader assigns the partitions of the topics that exist even
// when others do not (kafka-go's own leader assigns nothing at all then),
// under kafka-go's protocol names ("range", then "roundrobin"), so members
// running older versions of this package still join the same group.
// Reading metadata asks the brokers to create a missing topic, as
// kafka-go's group leader does: a cluster with auto.create.topics.enable
// creates it.
//
// Source.Assignment lists the partitions the source owns, and Source.Lag
// reports only those, so a lag gauge fed from it (metrics/effprom's
// ReportLag) shows which partitions each worker owns; Config.OnAssigned and
// Config.OnRevoked report every change.
//
// # Several databases
//
// When one PostgreSQL primary is not enough, Config.Routing spreads a
// group's partitions over several databases: one consumer per database,
// each over a Source of the same Group whose Routing names its database,
// and a Route function (the same in every member) giving each partition's
// database. The group's leader assigns a partition only to members of its
// database, so its effects, markers, parked rows and stored offsets stay
// in that database and every batch is one local transaction there. The
// producer must send a key's copies to one partition (a hashing
// partitioner), so that they meet in one database. Routed members use the
// group protocol RouteProtocol; members without Routing cannot join their
// group. See docs/scaling.md.
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
