package consumer_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
)

// stageLog records, per message ID, the stages its batch's passes went
// through.
type stageLog struct {
	mu     sync.Mutex
	stages map[string][]string
	piped  bool
}

func (l *stageLog) add(first, stage string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stages[first] = append(l.stages[first], stage)
}

// pipedBroker is a consumertest.Broker seen as a PipelineSource: it
// records when the consumer waits for the batch before.
type pipedBroker struct {
	*consumertest.Broker
	log *stageLog
}

func (b pipedBroker) BeforeCommit(context.Context, pgx.Tx, *consumer.Batch, []*consumer.Message) error {
	return nil
}
func (b pipedBroker) Pipeline() { b.log.mu.Lock(); b.log.piped = true; b.log.mu.Unlock() }
func (b pipedBroker) AwaitPrevious(_ context.Context, batch *consumer.Batch) error {
	for _, m := range batch.Messages {
		b.log.add(m.ID, "await")
	}
	return nil
}
func (b pipedBroker) Recall(*consumer.Batch) {}

var _ consumer.PipelineSource = pipedBroker{}

// stagedStrategy is idset recording its claims; sequenced makes the
// consumer treat it as a sequenced strategy.
type stagedStrategy struct {
	*idset.Strategy
	log       *stageLog
	sequenced bool
}

func (s stagedStrategy) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	for _, k := range keys {
		s.log.add(k.ID, "claim")
	}
	return s.Strategy.Claim(ctx, tx, keys)
}

func (s stagedStrategy) Sequenced() bool { return s.sequenced }

// TestPipelineSourceStages: with a PipelineSource the consumer waits for
// the lane's batch before (AwaitPrevious) once in every pass, before any
// handler runs, and, for a sequenced strategy, before the claim too: a
// claim that ran before the commit of the batch before would judge a
// sender's sequence without it.
func TestPipelineSourceStages(t *testing.T) {
	t.Parallel()
	for name, sequenced := range map[string]bool{"unsequenced": false, "sequenced": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 2})
			log := &stageLog{stages: map[string][]string{}}
			ids, err := idset.New(idset.Config{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 40 {
				e.broker.Publish(i%2, consumer.Message{ID: "m" + string(rune('a'+i/2)) + string(rune('0'+i%2)), Value: []byte("v")})
			}
			c := consumertest.NewConsumer(t, e.pool, pipedBroker{e.broker, log}, e.config(consumer.Config{
				Strategy: stagedStrategy{ids, log, sequenced}, BatchSize: 5,
				Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if err := insertEffect(ctx, tx, m); err != nil {
						return err
					}
					log.add(m.ID, "handle")
					return nil
				},
			}))
			e.runUntilIdle(c, time.Minute)
			want := "claim await handle"
			if sequenced {
				want = "await claim handle"
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			if !log.piped {
				t.Fatal("the consumer did not call Pipeline")
			}
			if len(log.stages) != 40 {
				t.Fatalf("%d messages recorded, want 40", len(log.stages))
			}
			for id, stages := range log.stages {
				if got := strings.Join(stages, " "); got != want {
					t.Errorf("%s: stages %q, want %q", id, got, want)
				}
			}
		})
	}
}
