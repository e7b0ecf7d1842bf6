// Package effprom exports a consumer's batches, messages and dedupe
// strategies as Prometheus metrics. It lives in its own package so that the
// core carries no dependency on the Prometheus client.
//
// Create a Metrics, register it, and pass it to the consumer as a hook:
//
//	m, err := effprom.New(effprom.Options{})
//	if err != nil { ... }
//	registry.MustRegister(m)
//	c, err := consumer.New(db, src, consumer.Config{..., Hooks: []consumer.Hook{m}})
//
// One Metrics may serve several consumers: every series carries a consumer
// label (Config.Name). Lanes (Kafka partitions, SQS FIFO groups) are not a
// label of the batch and message series, since their number is unbounded;
// they appear only in the lag gauge, which the caller sets per lane.
//
// # Metrics
//
// With the default namespace "effectively":
//
//	effectively_messages_total{consumer,outcome}       counter; outcome is applied, duplicate,
//	                                                    mismatch, parked, retried or gap (gap
//	                                                    messages are also counted as retried)
//	effectively_batches_total{consumer,result}          counter; result is ok, isolated (committed
//	                                                    after a handler failure was isolated),
//	                                                    fenced or error (rolled back)
//	effectively_handler_reruns_total{consumer}          counter of handler calls beyond the first for
//	                                                    a message within one batch (healthy messages
//	                                                    re-run while a failing one was isolated; see
//	                                                    consumer.BatchStats.Reruns)
//	effectively_batch_size{consumer}                    histogram of messages fetched per batch
//	effectively_batch_duration_seconds{consumer}        histogram, start of processing to settled
//	effectively_claim_duration_seconds{consumer,strategy}
//	effectively_handle_duration_seconds{consumer}
//	effectively_commit_duration_seconds{consumer}
//	effectively_ack_duration_seconds{consumer}          histograms of the batch's phases; a phase
//	                                                    that did not run is not observed
//	effectively_message_age_seconds{consumer}           histogram: from the broker accepting a message
//	                                                    (Message.Time) to its batch being settled,
//	                                                    for applied messages
//	effectively_lag_messages{consumer,lane}             gauge, set with SetLag
//
// # Strategies
//
// StrategyMetrics, from NewStrategies, exports a dedupe strategy's own
// counters and gauges (effectively_highwater_*, effectively_bloom_*), read
// at each scrape from any strategy that implements dedupe.StatsReporter;
// see its documentation for the names. Register it beside Metrics and
// watch each consumer's strategy:
//
//	strategies, err := effprom.NewStrategies(effprom.Options{})
//	if err != nil { ... }
//	registry.MustRegister(m, strategies)
//	err = strategies.Watch("payments", strategy)
//
// # Outbox relay
//
// RelayMetrics measures outbox relays: create it with NewRelay, register
// it, and pass it in outbox.RelayConfig.Hooks. Its series:
//
//	effectively_outbox_messages_total{sink,outcome}      counter; outcome is published, retried,
//	                                                     parked or held (behind a failure of its key)
//	effectively_outbox_parked_total{sink}                counter of messages refused for good
//	effectively_outbox_publish_duration_seconds{sink}    histogram of a sink's publish per pass
//	effectively_outbox_commit_to_publish_seconds{sink}   histogram, row created to published
//	effectively_outbox_wakeups_total{kind}               counter; kind is notify or poll
//	effectively_outbox_lease_changes_total{change}       counter of partitions acquired, lost or released
//	effectively_outbox_pass_errors_total                 counter of passes that ended in an error
//	effectively_outbox_waiting_rows{sink}                gauge of rows waiting (unpublished, not parked)
//	effectively_outbox_oldest_unpublished_seconds{sink}  gauge, age of the oldest waiting row
//
// The two gauges are set from the relay's backlog report, every
// outbox.RelayConfig.BacklogInterval.
//
// # Lag
//
// The consumer cannot know how far behind its source it is; the source or
// the application can. Report it with SetLag (messages behind, per lane) from
// wherever it is known, for example a goroutine that compares a Kafka
// partition's end offset with the committed offset every few seconds, and
// remove a lane that moved to another process with DeleteLag.
package effprom
