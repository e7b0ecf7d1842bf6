// Package failover holds the tests that run the consumer through a
// primary failover: a throwaway primary and a streaming standby (pgtest),
// a multi-host connection string with target_session_attrs=read-write,
// the primary killed mid-run and the standby promoted, with synchronous and
// asynchronous replication, with the test broker (consumertest, a source
// that forgets what it acknowledged), the SQS source on the fauxqs
// emulator and the Kafka source on kfake (whose offsets are stored in
// Postgres). The tests of patroni_test.go (build tag patroni, run by make
// test-patroni) run the same workloads on a pair managed by Patroni, which
// promotes the standby itself. Its non-test code is the tests' kit and
// RunKafka, which runs the Kafka workload for any Kafka source
// (sources/kafka in kafka_test.go, sources/franz in franz_test.go); what
// the tests show is written down in docs/failover.md. It lives in the
// integration module, with the Kafka chaos run, because it drives every
// source of the library (sources/franz is a module of its own).
package failover
