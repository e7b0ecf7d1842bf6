// Package sqs is a consumer.Source that reads an Amazon SQS queue with
// aws-sdk-go-v2.
//
// # Receiving
//
// Config.Receivers goroutines long-poll the queue (ReceiveMessage with up to
// ten messages and Config.WaitTime) and hold what they receive until the
// consumer fetches it; a receiver pauses while it holds Config.BufferSize
// unfetched messages (on a FIFO queue, while the receivers hold
// Config.Receivers × Config.BufferSize together). Receiving starts with the
// first Fetch. The lanes are scheduled by lanes.Lanes, as every source's
// are.
//
// Lanes: on a standard queue every receiver is a lane. On a FIFO queue every
// message group is a lane, so a group never has more than one batch in
// flight and its messages are handled in order, while different groups are
// handled in parallel. A batch holds messages of one lane only.
//
// # Visibility
//
// Every receive asks for Config.VisibilityTimeout. While the source holds a
// message (from its receive, through the consumer's transaction, until
// Settle), a heartbeat renews its visibility with ChangeMessageVisibilityBatch
// every Config.HeartbeatInterval at most, so a handler slower than the
// visibility timeout does not see its message delivered to another worker.
// Each lane's messages are renewed by calls of their own (ten messages at
// most), which run independently: a slow call delays only the renewal of
// its own lane's messages, never another lane's, nor the heartbeat itself.
// If the process dies, renewals stop and the message reappears after at
// most one visibility timeout.
//
// # Settling
//
// Settle deletes the acknowledged messages with DeleteMessageBatch, ten at a
// time, after the consumer's transaction committed. Entries that fail for a
// reason other than the sender's fault are retried; those still failing are
// reported as a *DeleteError and logged. Nothing is lost: their effects
// committed, and when SQS delivers them again the dedupe strategy recognises
// them and they are deleted then.
//
// A retried message is handed back with ChangeMessageVisibility set to the
// consumer's delay (rounded up to whole seconds). An abandoned message (in
// neither list) is only no longer renewed, and reappears when its
// visibility timeout runs out. On a FIFO queue a retried or abandoned
// message also hands back the messages of its group that the source holds
// but has not handed out yet, so SQS delivers them again after it, in order:
// SQS delivers nothing more of the group until the retried message was
// delivered again. Messages after it in the same batch that the consumer
// acknowledged stay acknowledged, which is why a FIFO batch holds one
// message unless Config.GroupBatchSize allows more. A standard queue keeps
// no order, so neither do its receiver lanes.
//
// Settle returns an error only when a delete or a visibility change may not
// have reached SQS (the messages then come back, and acknowledged ones are
// recognised as duplicates); a batch settled a second time is ignored, with
// nil, as consumer.Source requires.
//
// # Attempts
//
// Message.Attempt is SQS's ApproximateReceiveCount: the delivery count of
// consumer.Source, kept by the broker, so it carries on across crashes,
// restarts and other consumer processes. It also counts receives that never
// reached a consumer: messages released unfetched at Close, and on a FIFO
// queue those of a group handed back behind a retried or abandoned one
// (SQS returns several messages of a group in one receive). Such a message
// reaches the consumer's MaxAttempts after fewer failures of its own; give
// MaxAttempts room on busy FIFO groups. Beware the queue's redrive policy
// counts the same receives (see Exhausted messages).
//
// SQS bodies are Unicode text of at least one character, so Message.Value
// is never nil or empty.
//
// Close stops the receivers, letting their long polls in progress end (a
// cancelled long poll can still take messages on the server side, which
// would then stay hidden for a visibility timeout), and makes the messages
// received but never fetched visible again at once.
//
// # Exhausted messages
//
// By default the consumer parks a message whose attempts are used up (in
// Postgres, with the reason) and the source deletes it. With
// Config.UseQueueRedrive the queue's own redrive policy decides instead: New
// requires the queue to have one, and the consumer (told so through
// consumer.ExhaustionSource) never parks a message for running out of
// attempts: it keeps handing the message back until SQS moves it to the
// dead-letter queue. New logs at start-up which of the two applies, and warns when a
// queue without UseQueueRedrive has a redrive policy that could move messages
// before the consumer parks them.
//
// # Dedupe IDs
//
// Message.ID, the default dedupe ID (consumer.DefaultKey uses it), is:
//
//   - on a FIFO queue, the MessageDeduplicationId (explicit, or the
//     content hash SQS computed for content-based deduplication);
//   - on a standard queue, the message attribute Config.IDAttribute
//     ("idempotency-key" unless configured), which the producer sets to the
//     same value when it sends the same logical message twice;
//   - else, for an unwrapped SNS notification, the SNS MessageId;
//   - else the SQS MessageId. Beware: a MessageId only recognises a
//     redelivery of the same stored SQS message. A producer that sends the
//     same thing twice makes two MessageIds, and both are applied. Give such
//     producers an idempotency-key attribute, set Config.RequireIDAttribute,
//     or derive the key from the payload with the consumer's KeyFunc
//     (consumer.JSONField, say).
//
// # Resending the same body to a FIFO queue with content-based deduplication
//
// With ContentBasedDeduplication, a message sent without a
// MessageDeduplicationId gets the SHA-256 of its body as one, and that hash
// is its Message.ID. A producer that sends the same body again on purpose
// (a second, equal order) meets two filters. Within SQS's five-minute
// deduplication interval SQS itself drops the second send: SendMessage
// succeeds, returns the first message's MessageId, and nothing is
// delivered. After the interval SQS delivers it, but with the same
// Message.ID as the first, so the dedupe strategy finds the first one's
// marker and acknowledges the resend as a duplicate (the payloads match,
// so it is not even a mismatch): not applied, not parked, for as long as
// the strategy keeps its markers (seven days with idset's default
// retention). The source reports the interval through
// consumer.ContentIDSource, and the consumer warns at start-up when its
// strategy's retention is longer. A producer whose equal bodies can be
// distinct messages should send its own MessageDeduplicationId (a key
// that is the same for retries of one message and differs between
// messages), or the consumer's KeyFunc should read such a key from the
// body or an attribute.
//
// Message.Ref is the SQS MessageId (the same on every redelivery, and
// distinct for every message sent), Message.Lane the lane, Message.Attempt
// the ApproximateReceiveCount, Message.Time the SentTimestamp, and
// Message.Headers the message attributes (string and number attributes as
// their text, binary ones as their bytes). MessageInfo returns the rest of
// what SQS said (group, sequence number, SNS topic).
//
// # SNS envelopes and unreadable messages
//
// With Config.SNSEnvelope the body is an SNS notification (an SNS to SQS
// subscription without raw message delivery): Message.Value is its Message,
// its MessageAttributes come first in Message.Headers, and its MessageId is
// the fallback dedupe ID. A body that is not such an envelope (not JSON, or
// JSON without MessageId and Message) cannot be keyed: the source delivers
// it with an empty Message.ID, logs a warning, and records an
// *UnreadableError. Wrap the consumer's KeyFunc with ParkUnreadable so the
// consumer parks the message with that reason; the receivers go on. A
// standard-queue message without the ID attribute under
// Config.RequireIDAttribute is treated the same way.
//
// # Horizon
//
// Source implements consumer.HorizonSource: RedeliveryHorizon is the queue's
// MessageRetentionPeriod, read by New, which is how long a message processed
// but not deleted can come back. The dedupe strategy's retention should be
// longer.
package sqs
