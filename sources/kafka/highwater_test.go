package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
)

// TestEngineSequenceHeaders: producers number their messages in "sender"
// and "seq" headers; with SequenceKey and highwater in strict mode each
// sender's messages are applied once and in order, although some were sent
// twice and one failed on its first attempt (its sender's later messages
// wait for it as gaps).
func TestEngineSequenceHeaders(t *testing.T) { engineSequenceHeaders(t, false) }

// TestEngineSequenceHeadersPipelined: the same with Config.Pipeline, a
// partition's next batch handed out while its last one commits (the
// sequenced strategy claims only after that commit).
func TestEngineSequenceHeadersPipelined(t *testing.T) { engineSequenceHeaders(t, true) }

func engineSequenceHeaders(t *testing.T, pipeline bool) {
	const senders, perSender = 3, 100
	e := newEnv(t, 2)
	if _, err := e.pool.Exec(context.Background(), `ALTER TABLE effects ADD COLUMN n bigserial`); err != nil {
		t.Fatal(err)
	}
	var msgs []kafkago.Message
	for seq := 1; seq <= perSender; seq++ {
		for s := range senders {
			m := kafkago.Message{
				Partition: s % 2, // two senders share partition 0
				Value:     []byte(fmt.Sprintf("s%d-%d", s, seq)),
				Headers: []kafkago.Header{
					{Key: "sender", Value: []byte(fmt.Sprintf("s%d", s))},
					{Key: "seq", Value: []byte(fmt.Sprint(seq))},
				},
			}
			msgs = append(msgs, m)
			if seq%10 == 0 {
				msgs = append(msgs, m) // a producer retry
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.kafka.Produce(ctx, e.topic, msgs...); err != nil {
		t.Fatal(err)
	}
	strategy, err := highwater.New(highwater.Config{Mode: highwater.Strict})
	if err != nil {
		t.Fatal(err)
	}
	var failedOnce atomic.Bool
	h := &consumertest.Counter{}
	c := e.engine(e.source(func(c *Config) { c.Pipeline = pipeline }), h, func(cfg *consumer.Config) {
		cfg.Strategy = strategy
		cfg.Concurrency = 4 // two partitions: a goroutine to spare for each
		cfg.KeyFunc = SequenceKey("sender", "seq")
		cfg.GapDelay = 20 * time.Millisecond
		cfg.BatchHandler = nil
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if string(m.Value) == "s0-5" && failedOnce.CompareAndSwap(false, true) {
				return errors.New("transient failure")
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, off) VALUES ($1, $2, 0)`, string(m.Value), m.DedupeKey.Sender)
			return err
		}
	})
	r := consumertest.Start(c)
	waitFor(t, 30*time.Second, "every message applied", func() bool {
		var n int
		_ = e.pool.QueryRow(ctx, `SELECT count(DISTINCT msg_id) FROM effects`).Scan(&n)
		return n >= senders*perSender
	})
	r.Stop(t)
	var rows, distinct int
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != senders*perSender || distinct != rows {
		t.Fatalf("%d effect rows for %d distinct messages, want %d; %s", rows, distinct, senders*perSender, h)
	}
	for s := range senders {
		rs, err := e.pool.Query(ctx, `SELECT msg_id FROM effects WHERE lane = $1 ORDER BY n`, fmt.Sprintf("s%d", s))
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rs, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range got {
			if want := fmt.Sprintf("s%d-%d", s, i+1); id != want {
				t.Fatalf("sender s%d: effect %d is %s, want %s (out of order)", s, i, id, want)
			}
		}
	}
	if !failedOnce.Load() || h.Total().Retried == 0 {
		t.Errorf("the failure was not exercised: %s", h)
	}
}
