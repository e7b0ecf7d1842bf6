package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/lanes"
)

// ErrClosed is returned by Fetch after Close.
var ErrClosed = errors.New("sqs: source closed")

// Source is a consumer.Source (and consumer.HorizonSource) reading one SQS
// queue. See the package documentation.
type Source struct {
	cfg    Config
	client *sqs.Client
	url    string
	log    *slog.Logger

	fifo            bool
	contentDedupe   bool // a FIFO queue with ContentBasedDeduplication
	retention       time.Duration
	maxReceiveCount int
	deadLetterARN   string

	startOnce  sync.Once
	ctx        context.Context // the heartbeat's
	cancel     context.CancelFunc
	recvCtx    context.Context // the receivers': only cancelled if they overrun Close
	recvCancel context.CancelFunc
	recvWG     sync.WaitGroup
	hbWG       sync.WaitGroup

	// lanes schedules the received messages: a lane is a receiver of a
	// standard queue or a message group of a FIFO queue. Its buffer bound
	// is what makes a receiver pause.
	lanes *lanes.Lanes

	mu     sync.Mutex
	closed bool
	held   map[*entry]struct{} // received and not yet settled: the heartbeat renews them

	stats counters
}

var (
	_ consumer.Source           = (*Source)(nil)
	_ consumer.HorizonSource    = (*Source)(nil)
	_ consumer.ContentIDSource  = (*Source)(nil)
	_ consumer.ExhaustionSource = (*Source)(nil)
)

// New checks cfg, looks the queue up (its URL, whether it is FIFO, its
// retention and redrive policy) and returns a Source. Receiving starts with
// the first Fetch; call Close when done.
func New(ctx context.Context, cfg Config) (*Source, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	client := cfg.Client
	if client == nil {
		var opts []func(*awsconfig.LoadOptions) error
		if cfg.Region != "" {
			opts = append(opts, awsconfig.WithRegion(cfg.Region))
		}
		awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("sqs: load AWS configuration: %w", err)
		}
		if awsCfg.Region == "" {
			return nil, &ConfigError{Package: "sqs", Field: "Region", Reason: "not set, and the AWS default configuration chain has none (set AWS_REGION or Config.Region)"}
		}
		client = sqs.NewFromConfig(awsCfg, func(o *sqs.Options) {
			if cfg.Endpoint != "" {
				o.BaseEndpoint = aws.String(cfg.Endpoint)
			}
		})
	}
	s := &Source{
		cfg:    cfg,
		client: client,
		url:    cfg.QueueURL,
		log:    cfg.Logger,
		held:   map[*entry]struct{}{},
	}
	if s.url == "" {
		out, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(cfg.QueueName)})
		if err != nil {
			return nil, fmt.Errorf("sqs: look up queue %q: %w", cfg.QueueName, err)
		}
		s.url = aws.ToString(out.QueueUrl)
	}
	if err := s.readAttributes(ctx); err != nil {
		return nil, err
	}
	if cfg.UseQueueRedrive && s.maxReceiveCount == 0 {
		return nil, &ConfigError{Package: "sqs", Field: "UseQueueRedrive", Reason: fmt.Sprintf("queue %s has no RedrivePolicy to leave exhausted messages to", s.url)}
	}
	lc := lanes.Config{AutoLanes: true, LaneBuffer: cfg.BufferSize}
	if s.fifo {
		// A receiver fills many groups: its bound is on the receivers' total.
		lc = lanes.Config{AutoLanes: true, Buffer: cfg.BufferSize * cfg.Receivers}
	}
	s.lanes = lanes.New(lc)
	s.logStart()
	return s, nil
}

func (s *Source) readAttributes(ctx context.Context) error {
	out, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(s.url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameMessageRetentionPeriod,
			types.QueueAttributeNameFifoQueue,
			types.QueueAttributeNameContentBasedDeduplication,
			types.QueueAttributeNameRedrivePolicy,
		},
	})
	if err != nil {
		return fmt.Errorf("sqs: read attributes of queue %s: %w", s.url, err)
	}
	a := out.Attributes
	s.fifo = a[string(types.QueueAttributeNameFifoQueue)] == "true" || strings.HasSuffix(s.url, ".fifo")
	s.contentDedupe = s.fifo && a[string(types.QueueAttributeNameContentBasedDeduplication)] == "true"
	if v := a[string(types.QueueAttributeNameMessageRetentionPeriod)]; v != "" {
		secs, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("sqs: queue %s: MessageRetentionPeriod %q is not a number", s.url, v)
		}
		s.retention = time.Duration(secs) * time.Second
	} else {
		s.retention = 4 * 24 * time.Hour // the SQS default
	}
	if v := a[string(types.QueueAttributeNameRedrivePolicy)]; v != "" {
		var p struct {
			DeadLetterTargetArn string
			MaxReceiveCount     json.RawMessage
		}
		if err := json.Unmarshal([]byte(v), &p); err != nil {
			return fmt.Errorf("sqs: queue %s: RedrivePolicy is not JSON: %w", s.url, err)
		}
		n, err := strconv.Atoi(strings.Trim(string(p.MaxReceiveCount), `"`))
		if err != nil || n < 1 {
			return fmt.Errorf("sqs: queue %s: RedrivePolicy maxReceiveCount %s is not a positive number", s.url, p.MaxReceiveCount)
		}
		s.maxReceiveCount, s.deadLetterARN = n, p.DeadLetterTargetArn
	}
	return nil
}

func (s *Source) logStart() {
	kind := "standard"
	if s.fifo {
		kind = "fifo"
	}
	if s.contentDedupe {
		kind = "fifo, content-based deduplication"
	}
	s.log.Info("sqs: source ready", "queue", s.url, "kind", kind, "receivers", s.cfg.Receivers,
		"visibility_timeout", s.cfg.VisibilityTimeout, "heartbeat", s.cfg.HeartbeatInterval,
		"wait", s.cfg.WaitTime, "retention", s.retention)
	switch {
	case s.cfg.UseQueueRedrive:
		s.log.Info("sqs: exhausted messages are left to the queue's redrive policy",
			"max_receive_count", s.maxReceiveCount, "dead_letter_queue", s.deadLetterARN)
	case s.maxReceiveCount > 0:
		s.log.Warn("sqs: exhausted messages are parked in Postgres by the consumer and deleted, but the queue also has a redrive policy: keep the consumer's MaxAttempts below maxReceiveCount, or messages reach the dead-letter queue first",
			"max_receive_count", s.maxReceiveCount, "dead_letter_queue", s.deadLetterARN)
	default:
		s.log.Info("sqs: exhausted messages are parked in Postgres by the consumer and deleted")
	}
}

// QueueURL returns the queue's URL.
func (s *Source) QueueURL() string { return s.url }

// FIFO reports whether the queue is a FIFO queue.
func (s *Source) FIFO() bool { return s.fifo }

// MaxReceiveCount returns the maxReceiveCount of the queue's redrive
// policy, or 0 if it has none.
func (s *Source) MaxReceiveCount() int { return s.maxReceiveCount }

// fifoDedupeWindow is SQS's deduplication interval on FIFO queues.
const fifoDedupeWindow = 5 * time.Minute

// ContentIDWindow returns SQS's five-minute deduplication interval on a
// FIFO queue with content-based deduplication, where Message.ID of a
// message sent without a MessageDeduplicationId is the SHA-256 of its body,
// and 0 on other queues (consumer.ContentIDSource). See the package
// documentation for what a deliberate resend of the same body meets.
func (s *Source) ContentIDWindow() time.Duration {
	if s.contentDedupe {
		return fifoDedupeWindow
	}
	return 0
}

// RedeliveryHorizon returns the queue's message retention period: a message
// received, processed and not deleted (a crash before the delete) can be
// delivered again until then.
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, error) { return s.retention, nil }

func (s *Source) start() {
	s.startOnce.Do(func() {
		s.ctx, s.cancel = context.WithCancel(context.Background())
		s.recvCtx, s.recvCancel = context.WithCancel(context.Background())
		for i := 0; i < s.cfg.Receivers; i++ {
			s.recvWG.Add(1)
			go s.receive(i)
		}
		s.hbWG.Add(1)
		go s.heartbeat()
	})
}

// Fetch returns up to max held messages of one lane that has no batch in
// flight, in lane order, waiting for messages to arrive if there are none.
func (s *Source) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	if max <= 0 {
		max = maxPerReceive
	}
	if s.fifo {
		max = min(max, s.cfg.GroupBatchSize)
	}
	s.start()
	b, err := s.lanes.Next(ctx, max)
	if errors.Is(err, lanes.ErrClosed) {
		return nil, ErrClosed
	}
	if err != nil {
		return nil, err
	}
	b.SourceData = s
	return b, nil
}

// settleTimeout bounds the deletes and visibility changes of one Settle; it
// runs even when Settle's context is done, since a delete that is skipped
// costs a redelivery.
const settleTimeout = 30 * time.Second

// Settle deletes the acknowledged messages (DeleteMessageBatch, failed
// entries retried), hands the retried ones back with their delay as
// visibility timeout, and stops renewing the visibility of the abandoned
// ones, which reappear when it runs out. On a FIFO queue, a batch with a
// retried or abandoned message also releases the group's messages received
// after it, so the group is delivered again in order. It returns an error
// only when a delete or a visibility change may not have reached SQS (a
// *DeleteError for deletes), and nil for a batch settled already.
func (s *Source) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	if src, ok := b.SourceData.(*Source); !ok || src != s {
		return errors.New("sqs: Settle: batch did not come from this source")
	}
	inBatch := make(map[*entry]bool, len(b.Messages))
	for _, m := range b.Messages {
		if e, ok := m.SourceData.(*entry); ok {
			inBatch[e] = true
		}
	}
	var acked []*entry
	for _, m := range ack {
		if e, ok := m.SourceData.(*entry); ok && inBatch[e] {
			acked = append(acked, e)
			delete(inBatch, e)
		}
	}
	var retried []visibilityChange
	var maxDelay time.Duration
	for _, r := range retry {
		if e, ok := r.Message.SourceData.(*entry); ok && inBatch[e] {
			retried = append(retried, visibilityChange{e: e, timeout: r.Delay})
			maxDelay = max(maxDelay, r.Delay)
			delete(inBatch, e)
		}
	}
	abandoned := len(inBatch)

	s.mu.Lock()
	// The queue redelivers what is not deleted: the lane keeps nothing for
	// redelivery itself. A FIFO group gives back the messages received after
	// a retried or abandoned one, so that the group comes again in order.
	ok, dropped := s.lanes.Finish(b, s.fifo && (len(retried) > 0 || abandoned > 0))
	if !ok {
		// Settled already: the first Settle's outcome stands, and this one
		// is not the source's to apply (consumer.Source's contract).
		s.mu.Unlock()
		s.log.Debug("sqs: Settle of a batch that is no longer in flight ignored", "queue", s.url, "lane", b.Lane)
		return nil
	}
	for _, m := range b.Messages {
		delete(s.held, m.SourceData.(*entry))
	}
	released := make([]*entry, len(dropped))
	for i, m := range dropped {
		released[i] = m.SourceData.(*entry)
		delete(s.held, released[i])
	}
	s.mu.Unlock()

	// Stop renewals; the messages handed back wait for a renewal in
	// flight, so that their visibility change comes after it.
	var renewals []<-chan struct{}
	handedBack := make(map[*entry]bool, len(retried))
	for _, c := range retried {
		handedBack[c.e] = true
	}
	for _, m := range b.Messages {
		e := m.SourceData.(*entry)
		if ch := e.markSettled(); ch != nil && handedBack[e] {
			renewals = append(renewals, ch)
		}
	}
	for _, e := range released {
		if ch := e.markSettled(); ch != nil && len(retried) > 0 {
			renewals = append(renewals, ch)
		}
		if len(retried) > 0 {
			// Later messages of the group come back no earlier than the
			// retried one before them. After an abandon they simply run out
			// their visibility timeout together with it.
			retried = append(retried, visibilityChange{e: e, timeout: maxDelay})
		}
	}
	s.stats.retried.Add(int64(len(retry)))
	s.stats.abandoned.Add(int64(abandoned))
	s.stats.released.Add(int64(len(released)))

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	for _, ch := range renewals {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	var errs []error
	if err := s.changeVisibility(ctx, retried); err != nil {
		errs = append(errs, fmt.Errorf("sqs: hand back %d retried messages: %w", len(retried), err))
	}
	if err := s.deleteMessages(ctx, acked); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// markSettled stops renewals of e and returns the channel of a renewal in
// flight (closed when it ends), or nil.
func (e *entry) markSettled() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.settled = true
	return e.renewing
}

func (e *entry) isSettled() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.settled
}

// Close stops receiving and renewing visibility, and hands back at once
// the messages that were received but never fetched. It lets the long polls
// in progress end rather than cancelling them (a cancelled long poll can
// still take messages on the server side, which would then stay invisible
// for a visibility timeout), so it can take up to Config.WaitTime. Batches
// still in flight can be settled after Close; their messages are no longer
// renewed.
func (s *Source) Close() error {
	s.startOnce.Do(func() { // never start after Close
		s.cancel, s.recvCancel = func() {}, func() {}
	})
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	unfetched := s.lanes.Close()
	s.mu.Unlock()

	done := make(chan struct{})
	go func() { s.recvWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.WaitTime + 10*time.Second):
		s.recvCancel()
		<-done
	}
	s.recvCancel()
	s.cancel()
	s.hbWG.Wait()

	s.mu.Lock()
	changes := make([]visibilityChange, len(unfetched))
	for i, m := range unfetched {
		e := m.SourceData.(*entry)
		delete(s.held, e)
		changes[i] = visibilityChange{e: e}
	}
	s.mu.Unlock()
	for _, c := range changes {
		c.e.markSettled()
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if err := s.changeVisibility(ctx, changes); err != nil {
		return fmt.Errorf("sqs: release %d unfetched messages: %w", len(changes), err)
	}
	s.stats.released.Add(int64(len(changes)))
	return nil
}

// ParkExhausted tells the consumer whether to park a message whose attempts
// are used up (consumer.ExhaustionSource): not with Config.UseQueueRedrive,
// where the queue's redrive policy moves it to the dead-letter queue.
func (s *Source) ParkExhausted() bool { return !s.cfg.UseQueueRedrive }
