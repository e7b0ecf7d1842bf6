// Package lanes is the lane scheduler every source of this module builds
// on, and that a new source can build on too: it keeps the order within a
// lane, one batch in flight per lane, delayed redelivery, bounded buffers
// and fairness across lanes that the [consumer.Source] contract asks for,
// so that a source only fetches from its broker and acknowledges to it.
//
// A goroutine of the source Reserves room, pulls from the broker and Adds
// what came under its lane; the source's Fetch is [Lanes.Next]; its Settle
// acknowledges to the broker and calls [Lanes.Settle] (the source
// redelivers retried and abandoned messages itself, as the Kafka sources
// do) or [Lanes.Finish] (the broker redelivers them, as SQS does once a
// visibility timeout runs out).
package lanes
