// Package sinktest is the conformance suite every Kafka sink of the outbox
// runs (outbox.KafkaSink on kafka-go, franzsink.Sink on franz-go): the
// same relay, the same in-process cluster (or KAFKA_BROKERS), the same
// foreign read-committed reader (franz-go's kgo), and the same failures
// injected into the broker. A sink's test passes Run a constructor; the
// suite checks the outbox.Sink contract through a relay:
//
//   - each message reaches the topic with its key, value, headers and the
//     outbox.IDHeader header;
//   - nothing marked published is missing from the topic;
//   - a message the broker refuses for good (over the topic's
//     max.message.bytes, or for a topic that does not exist) is parked with
//     the broker's reason, and holds back its key's later messages and no
//     other;
//   - a topic whose max.message.bytes is below the sink's request size
//     costs no message;
//   - each key's first occurrences in the topic follow commit order while
//     the broker refuses, times out and holds produce requests;
//   - a topic is unknown only when the broker says so: a topic created
//     after the client read the cluster's metadata, or one a broker calls
//     unknown for a moment while it exists, costs no message.
//
// CheckNothingLost is exported on its own for a sink's table of client
// settings it accepts.
package sinktest
