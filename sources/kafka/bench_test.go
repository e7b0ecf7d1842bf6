package kafka

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	kafkago "github.com/segmentio/kafka-go"
)

// BenchmarkPipeline compares, in one run, end-to-end throughput of the same
// engine pipeline (idset, one effect row per message, batches of 500) fed by
// Kafka through this source and by the in-memory consumertest broker, and
// plain kafka-go group consumption without Postgres. Run with a fixed count:
//
//	go test -run '^$' -bench Pipeline -benchtime 100000x ./sources/kafka
func BenchmarkPipeline(b *testing.B) {
	const partitions, batch = 4, 500
	b.Run("kafka-go-plain", func(b *testing.B) {
		k, topic := benchTopic(b, partitions, b.N)
		r := kafkago.NewReader(kafkago.ReaderConfig{
			Brokers: k.Brokers(), GroupID: kafkatest.Name("plain"), Topic: topic,
			MaxWait: kafkatest.MaxWait, SessionTimeout: kafkatest.SessionTimeout,
			HeartbeatInterval: kafkatest.HeartbeatInterval, CommitInterval: time.Second,
			StartOffset: kafkago.FirstOffset,
		})
		defer r.Close()
		ctx := context.Background()
		b.ResetTimer()
		for range b.N {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.CommitMessages(ctx, m); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("kafka-engine", func(b *testing.B) {
		k, topic := benchTopic(b, partitions, b.N)
		pool := pgtest.NewPool(b)
		src, err := New(pool, Config{
			Brokers: k.Brokers(), Group: kafkatest.Name("bench"), Topics: []string{topic},
			MaxWait: kafkatest.MaxWait, SessionTimeout: kafkatest.SessionTimeout, HeartbeatInterval: kafkatest.HeartbeatInterval,
		})
		if err != nil {
			b.Fatal(err)
		}
		defer src.Close()
		if _, err := pg.Migrate(context.Background(), pool, "", src.Migrations()...); err != nil {
			b.Fatal(err)
		}
		runPipeline(b, pool, src, batch)
	})
	b.Run("consumertest-engine", func(b *testing.B) {
		pool := pgtest.NewPool(b)
		src := consumertest.New(consumertest.Config{Lanes: partitions})
		for i := range b.N {
			v := strconv.Itoa(i)
			src.Publish(i%partitions, consumer.Message{ID: "k-" + v, Value: []byte(v)})
		}
		runPipeline(b, pool, src, batch)
	})
}

// benchTopic starts a cluster with a topic holding n messages.
func benchTopic(b *testing.B, partitions, n int) (*kafkatest.Cluster, string) {
	b.Helper()
	k := kafkatest.New(b)
	topic := kafkatest.Name("bench")
	ctx := context.Background()
	if err := k.CreateTopic(ctx, topic, partitions); err != nil {
		b.Fatal(err)
	}
	w := k.Writer(topic)
	defer w.Close()
	const chunk = 10000
	msgs := make([]kafkago.Message, 0, chunk)
	for from := 0; from < n; from += chunk {
		msgs = msgs[:0]
		for i := from; i < min(from+chunk, n); i++ {
			v := strconv.Itoa(i)
			msgs = append(msgs, kafkago.Message{Partition: i % partitions, Value: []byte(v),
				Headers: []kafkago.Header{{Key: DefaultIDHeader, Value: []byte("k-" + v)}}})
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			b.Fatal(err)
		}
	}
	return k, topic
}

// applied counts applied messages and signals when a target is reached.
type applied struct {
	n, target atomic.Int64
	done      chan struct{}
}

func (a *applied) BatchDone(_ context.Context, s *consumer.BatchStats) {
	if a.n.Add(int64(s.Applied)) >= a.target.Load() {
		select {
		case <-a.done:
		default:
			close(a.done)
		}
	}
}

// runPipeline runs an engine over src until b.N messages were applied.
func runPipeline(b *testing.B, pool pg.DB, src consumer.Source, batch int) {
	b.Helper()
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		b.Fatal(err)
	}
	a := &applied{done: make(chan struct{})}
	a.target.Store(int64(b.N))
	c := consumertest.NewConsumer(b, pool, src, consumer.Config{
		Name: "bench", Strategy: strategy, BatchHandler: insertEffects, BatchSize: batch,
		Hooks: []consumer.Hook{a},
	})
	if _, err := pgExec(pool, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	r := consumertest.Start(c)
	<-a.done
	b.StopTimer()
	r.Stop(b)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func pgExec(db pg.DB, sql string) (int64, error) {
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, sql)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), tx.Commit(ctx)
}
