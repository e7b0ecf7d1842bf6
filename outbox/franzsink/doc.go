// Package franzsink is an outbox.Sink on franz-go (github.com/twmb/franz-go),
// for teams whose Kafka client is franz-go. It is a module of its own, so
// the core never requires franz-go's producer.
//
// The sink produces through franz-go's idempotent producer, kgo's default:
// acks from all in-sync replicas, ordered retries with up to five requests
// in flight per broker, and sequence numbers the broker checks, so a retry
// neither duplicates a record nor lets a later one overtake it. A key's
// order survives the broker's retries by construction, and so does the
// relay's rule that nothing is marked published that the broker did not
// acknowledge.
//
// Choosing between it and outbox.KafkaSink (kafka-go) is about the client
// the rest of the program uses; both pass the same conformance suite. See
// docs/pipelines.md.
//
//	sink, err := franzsink.New(franzsink.Config{
//		Topic: "payments.settled",
//		Opts:  []kgo.Opt{kgo.SeedBrokers("kafka:9092")},
//	})
//	if err != nil { ... }
//	defer sink.Close()
//	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Sinks: map[string]outbox.Sink{"settled": sink}})
package franzsink
