// Package kafkatest runs an in-process Kafka cluster (franz-go's kfake,
// which speaks the real Kafka protocol) for tests, benchmarks and runnable
// examples, and has helpers to create topics, produce records and read a
// group's committed offsets.
//
// The in-process cluster expires group members as Kafka's coordinator
// does, which kfake alone misses for a member closed while its JoinGroup
// waited (see sessions.go): without that, a test that closes one consumer
// while another joins could leave a partition assigned to the closed one
// for good.
//
// When the environment variable KAFKA_BROKERS is set (a comma-separated
// list of host:port), Start uses that cluster instead, so the same tests run
// against a real Kafka. Tests should then name their topics and groups with
// Name, which makes them unique per run.
//
// For clusters that take TLS or SASL, NewCA makes an in-memory certificate
// authority whose ServerTLS goes to kfake.TLS and whose ClientTLS (with or
// without a client certificate) to UseTLS and the code under test;
// UseSASL sets the helpers' SASL mechanism for kfake.EnableSASL.
//
// The constants hold the kafka-go settings that keep tests quick: a short
// fetch MaxWait (kafka-go's 10s default makes closing a reader slow), a short
// Writer BatchTimeout, and a session timeout that a real broker's default
// group.min.session.timeout.ms (6s) accepts.
package kafkatest
