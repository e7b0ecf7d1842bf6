// Package franz is a consumer.Source over a Kafka consumer group, built on
// twmb/franz-go's kgo client.
package franz
