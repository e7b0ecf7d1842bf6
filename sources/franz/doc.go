// Package franz is a consumer.Source over a Kafka consumer group, built on
// twmb/franz-go's kgo client: kgo runs the group membership (classic
// protocol, cooperative-sticky by default, static membership with
// Config.InstanceID) and the fetches, and the source adds what sources/kafka
// gives a kafka-go team: per-partition lanes, offsets in Postgres in the
// batch's transaction with generation fencing, read-committed by default,
// nil apart from empty. It is a module of its own
// (github.com/effectively-once/effectively/sources/franz), so the core
// module never requires franz-go.
//
// Everything kgo configures is configured with kgo's own options in
// Config.Opts: TLS (kgo.DialTLSConfig), SASL (kgo.SASL with franz-go's
// pkg/sasl/plain, scram, oauth or aws mechanisms), the session, heartbeat
// and rebalance timeouts, the balancers, fetch sizes and waits, logging and
// hooks (franz-go's plugin/kprom). For example, SCRAM over TLS with a
// private CA:
//
//	src, err := franz.New(pool, franz.Config{
//		Brokers: brokers, Group: "ledger", Topics: []string{"transfers"},
//		Opts: []kgo.Opt{
//			kgo.DialTLSConfig(&tls.Config{RootCAs: ca}),
//			kgo.SASL(scram.Auth{User: user, Pass: os.Getenv("KAFKA_PASSWORD")}.AsSha512Mechanism()),
//		},
//	})
//
// A refused SASL login or a failed TLS handshake on a certificate makes
// Fetch return an error matching ErrAuthentication, which is permanent:
// the consumer's Run stops with it rather than retrying.
//
// Every assigned partition is a lane: partitions are processed in parallel,
// records of one partition in offset order, and a partition never has more
// than one batch in flight. A partition holding Config.PartitionBuffer
// undelivered records is paused in kgo until the consumer took half.
//
// # Offsets in Postgres
//
// The source keeps its positions in sources/kafka's offsets table, with
// sources/kafka's code (kafka.OffsetStore): the same rows, the same claim
// and the same fencing, so the CLI's offsets and replay commands and
// kafka.Offsets work for both sources, and a group can move from one
// source to the other and keep its positions. BeforeCommit writes
// (group, topic, partition) → next offset, generation inside the batch's
// transaction, so the position moves exactly when the batch's effects
// commit.
//
// When the group assigns partitions to this member, the source claims
// their rows for the member's generation (kgo.AdjustFetchOffsetsFn, before
// anything is fetched) and starts each from the offset stored there,
// falling back to the offset committed to Kafka and then to kgo's reset
// offset (kgo.ConsumeResetOffset, the start of the log by default). A
// member of an older generation (a zombie that missed a rebalance) can no
// longer write those rows: its BeforeCommit fails with an error wrapping
// consumer.ErrFenced, the transaction rolls back, and its batch leaves no
// effect. A row locked by a transaction in progress (a batch of the
// previous owner past BeforeCommit, not yet committed, perhaps of a frozen
// process) is not waited for: that partition stays paused and is claimed
// again, after 50ms doubling up to 1s, until the transaction ended, while
// the other partitions start at once. The consumer bounds how long such a
// transaction can stay open (consumer.Config.IdleTxTimeout, 10s by
// default).
//
// Offsets are also committed to Kafka after each transaction (every
// second, and on revoke), never past what committed in Postgres, with the
// partition's origin as commit metadata (see kafka.OriginMetadata). The
// offset in Postgres wins: to move a group's position, update the table
// while the group is stopped (the CLI's replay command does). With
// Config.KafkaOffsetsOnly, the offsets in Kafka are the only position:
// no fencing, and redeliveries are left to the dedupe strategy.
//
// # Database failover
//
// A promoted standby that lacked the primary's last commits lacks their
// offsets too: a running source's next offset write finds the row behind
// what it knew it stored (or gone), the batch is fenced, and the source
// claims the partition again and consumes it from the offset the table
// holds, so the lost range is applied again, once. A partition with no
// row at all whose Kafka commit carries the origin lost its row with the
// database's last commits: the source consumes it again from the origin,
// not from the offset in Kafka (docs/failover.md).
//
// # Rebalances and failover
//
// When partitions are revoked (kgo's OnPartitionsRevoked, before the member
// rejoins), no more batches of them are handed out; batches in flight may
// still commit for up to Config.RevokeTimeout, after which they are
// abandoned (their commit is refused and nothing is acknowledged for
// them); then their offsets are committed to Kafka. Under the default
// cooperative-sticky balancer only the partitions that move are revoked,
// and the others go on without pause; under an eager balancer
// (kgo.RangeBalancer, kgo.RoundRobinBalancer) every rebalance revokes
// every partition, as kafka-go's groups do. Partitions lost (kgo's
// OnPartitionsLost: the session expired, a fatal group error) are dropped
// at once; the Postgres fence keeps their batches out. Close leaves the
// group and abandons the batches in flight; the others take its
// partitions over at once (within about a heartbeat interval and the
// claim: 0.2s in the tests, TestCleanStopHandsOver), for a static member
// too (see below).
//
// A worker that stops without leaving the group (kill -9, a crash, a lost
// host) keeps its partitions until the coordinator's session timeout
// expires (kgo.SessionTimeout, 45s by default in franz-go, 10s in
// sources/kafka); then the group rebalances and the others take them over
// after their next heartbeat (kgo.HeartbeatInterval, 3s by default): the
// partitions stall for about the session timeout plus a heartbeat
// interval, at most the session timeout plus the rebalance timeout. A
// frozen worker's open transaction holds its locked offsets row until
// PostgreSQL ends it after consumer.Config.IdleTxTimeout; when the worker
// wakes, its commit fails and its retry is fenced. The multi-process chaos
// run (the repository's integration/chaos/franz) checks these bounds with
// kill -9 and SIGSTOP.
//
// # Static membership
//
// With Config.InstanceID (KIP-345) a restarted worker does not wait for
// the session timeout: started again with the same instance ID (a
// StatefulSet pod's name, a slot number; every live process its own), it
// takes its dead member's place as soon as it joins, in a rebalance the
// others join within a heartbeat while they go on consuming their own
// partitions (cooperative-sticky), and it usually gets the same
// partitions back. A kill then costs its partitions about the restart
// (the process start, the join and the claim): 1-2s in the chaos run,
// against the session timeout and more without static membership. A
// worker that is not restarted is still dropped after the session
// timeout, and a frozen one whose session expired rejoins as a new member
// when it wakes. The coordinator fences the member that a replacement
// displaced; if that process was alive after all (two processes given
// one instance ID), its next group request fails with
// FENCED_INSTANCE_ID, it loses its partitions (the Postgres fence refuses
// any batch still in flight), and the source stops: Fetch returns a
// permanent error matching ErrFencedInstance, rather than rejoining and
// fencing the other in turn. Kafka's static members send no LeaveGroup
// when they close, so that a restart finds its place kept; Close sends
// one all the same, naming the instance ID, so that a worker stopped on
// purpose hands its partitions over at once rather than after the session
// timeout (a rolling restart then rebalances twice per worker; the
// others consume meanwhile).
//
// # Messages
//
// Message.ID is the value of the Config.IDHeader header ("idempotency-key"
// by default), or "topic/partition/offset" when it is missing or empty;
// Message.Ref is "topic/partition@offset", Message.Lane "topic/partition",
// Message.Key the record key, Message.Source "kafka" (as sources/kafka's,
// so dashboards and parked rows treat both alike). Position tells a
// message's topic, partition and offset.
//
// Retried messages are kept by the source and delivered again after their
// delay; abandoned ones at once; once due, before the partition's records
// not yet delivered, while the records after a retried one go on.
// Message.Attempt counts deliveries within the process, across rebalances
// that give a partition back to the same Source; a new Source starts again
// at 1. Settle never talks to Kafka and returns nil.
//
// # Transactions, null and empty values
//
// Records are read with read-committed isolation by default: kgo drops the
// records of aborted transactions and the control records, so only records
// of committed transactions, and of producers that use no transactions,
// are delivered. Config.ReadUncommitted also delivers the others. The
// offsets of delivered messages can then have gaps; the commit point moves
// past dropped records with the next delivered one (at the end of a
// partition, Lag counts the markers of its last transaction until more
// records come).
//
// A null value (a tombstone), key or header value arrives as nil, an empty
// one as a non-nil empty slice; the consumer keeps them apart through the
// handler, the parked table and redrive.
package franz
