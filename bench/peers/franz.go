package peers

import (
	"context"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/sources/franz"
	"github.com/twmb/franz-go/pkg/kgo"
)

// FranzShape is the handler shape measured with sources/franz beside the
// same shape with sources/kafka.
const FranzShape = "BatchHandler"

// runFranz consumes with sources/franz (franz-go's kgo client) and the
// consumer, with the same strategy, batches and handler as runEffectively.
func runFranz(shape Shape) runFunc {
	return func(ctx context.Context, spec Spec, p *progress) error {
		pool, err := openPool(ctx, spec.DB)
		if err != nil {
			return err
		}
		defer pool.Close()
		src, err := franz.New(pool, franz.Config{
			Brokers: spec.Brokers, Group: spec.Group, Topics: []string{spec.Topic},
			Opts: []kgo.Opt{
				kgo.FetchMaxWait(maxWait),
				kgo.SessionTimeout(spec.SessionTimeout),
				kgo.HeartbeatInterval(heartbeat(spec)),
			},
		})
		if err != nil {
			return err
		}
		defer src.Close()
		strategy, err := idset.New(idset.Config{})
		if err != nil {
			return err
		}
		cfg := consumer.Config{Name: "ledger", Strategy: strategy, BatchSize: Batch}
		shape.Set(&cfg)
		c, err := consumer.New(pool, &trackedFranz{Source: src, p: p}, cfg)
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
}

// trackedFranz is tracked for sources/franz: the worker's progress
// reported around Fetch and Settle, every optional interface of the
// source kept by embedding it.
type trackedFranz struct {
	*franz.Source
	p *progress
}

func (t *trackedFranz) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	b, err := t.Source.Fetch(ctx, max)
	if err == nil && b != nil && len(b.Messages) > 0 {
		t.p.inHand()
	}
	return b, err
}

func (t *trackedFranz) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	t.p.commit(len(ack))
	err := t.Source.Settle(ctx, b, ack, retry)
	for _, m := range ack {
		if _, partition, offset, ok := franz.Position(m); ok {
			t.p.settled(int32(partition), offset)
		}
	}
	return err
}

var _ consumer.TxSource = (*trackedFranz)(nil)
