package outbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// The processes of TestChainedKill run this test binary again with
// chainRole set; TestChainChild is what they run. Each prints "ready" once
// it is set up, then "stats <applied> <duplicates> <parked>" every 100 ms,
// and runs until it is killed or its stdin closes.
const (
	chainRole    = "CHAIN_CHILD"     // stage-a, stage-b, log-relay or table-relay
	chainDB      = "CHAIN_DB"        // the database's URL
	chainBrokers = "CHAIN_BROKERS"   // comma-separated Kafka bootstrap addresses
	chainIn      = "CHAIN_IN_TOPIC"  // stage A's input topic
	chainOut     = "CHAIN_OUT_TOPIC" // the relays' Kafka topic, when the sink is Kafka
	chainQueue   = "CHAIN_QUEUE"     // the relays' SQS queue URL, when the sink is SQS
	chainTable   = "CHAIN_TABLE"     // set: the relays poll the table, so stage A emits in TableMode
)

// Stage A parks the inputs chainPoisonA says; stage B parks the messages
// whose input chainPoisonB says. Both are permanent failures: parked at
// once, without retries.
func chainPoisonA(n int) bool { return n%97 == 13 }
func chainPoisonB(n int) bool { return n%89 == 29 }

// chainInput parses "in-<n>".
func chainInput(s string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(s, "in-"))
	if err != nil {
		return -1
	}
	return n
}

func TestChainChild(t *testing.T) {
	role := os.Getenv(chainRole)
	if role == "" {
		t.Skip("run by TestChainedKill in a child process")
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() { // the parent is gone, or done with this process
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	db, err := pgxpool.New(ctx, os.Getenv(chainDB))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var counts chainCounts
	var run func(context.Context) error
	switch role {
	case "stage-a":
		run = chainStageA(t, ctx, db, &counts)
	case "stage-b":
		run = chainStageB(t, ctx, db, &counts)
	case "log-relay", "table-relay":
		run = chainRelay(t, db, role == "log-relay", &counts)
	default:
		t.Fatalf("unknown %s %q", chainRole, role)
	}
	fmt.Println("ready")
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			fmt.Println("stats", counts.String())
			if err != nil && ctx.Err() == nil {
				t.Fatal(err)
			}
			return
		case <-tick.C:
			fmt.Println("stats", counts.String())
		}
	}
}

// chainCounts are what a child reports to the parent.
type chainCounts struct{ applied, duplicates, parked atomic.Int64 }

func (c *chainCounts) String() string {
	return fmt.Sprintf("%d %d %d", c.applied.Load(), c.duplicates.Load(), c.parked.Load())
}

// BatchDone counts a stage's outcomes.
func (c *chainCounts) BatchDone(_ context.Context, s *consumer.BatchStats) {
	c.applied.Add(int64(s.Applied))
	c.duplicates.Add(int64(s.Duplicate))
	c.parked.Add(int64(s.Parked))
}

var _ consumer.Hook = (*chainCounts)(nil)

// PassDone counts a relay's publishes.
func (c *chainCounts) PassDone(_ context.Context, s *PassStats) {
	published, _, parked, _ := s.Counts()
	c.applied.Add(int64(published))
	c.parked.Add(int64(parked))
}

var _ RelayHook = (*chainCounts)(nil)

func chainKafkaSource(t *testing.T, db *pgxpool.Pool, group, topic string) *kafka.Source {
	src, err := kafka.New(db, kafka.Config{
		Brokers: strings.Split(os.Getenv(chainBrokers), ","), Group: group, Topics: []string{topic},
		MaxWait: kafkatest.MaxWait, SessionTimeout: kafkatest.SessionTimeout,
		HeartbeatInterval: kafkatest.HeartbeatInterval, RebalanceTimeout: 5 * time.Second,
		JoinGroupBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func chainConsumer(t *testing.T, ctx context.Context, db *pgxpool.Pool, src consumer.Source, cfg consumer.Config) func(context.Context) error {
	c, err := consumer.New(db, src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return c.Run
}

// chainStageA is stage A: a Kafka consumer whose BatchHandler emits one
// message per input and records the input in a_effects, in one statement
// each.
func chainStageA(t *testing.T, ctx context.Context, db *pgxpool.Pool, counts *chainCounts) func(context.Context) error {
	mode := LogMode
	if os.Getenv(chainTable) != "" {
		mode = TableMode
	}
	o, err := New(Config{Sinks: []string{"out"}, Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(ctx, db, "", o.Line()); err != nil {
		t.Fatal(err)
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	src := chainKafkaSource(t, db, "stage-a", os.Getenv(chainIn))
	return chainConsumer(t, ctx, db, src, consumer.Config{Name: "stage-a", Strategy: strategy, BatchSize: 200,
		Hooks: []consumer.Hook{counts}, Logger: consumertest.Logger(),
		BatchHandler: func(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
			inputs := make([]string, len(ms))
			accounts := make([]string, len(ms))
			ids := make([]string, len(ms))
			out := make([]Message, len(ms))
			for i, m := range ms {
				input := string(m.Value)
				if n := chainInput(input); n < 0 || chainPoisonA(n) {
					return consumer.Permanent(fmt.Errorf("stage A refuses input %q", input))
				}
				inputs[i], accounts[i], ids[i] = input, string(m.Key), ID(m, 0)
				out[i] = Message{Sink: "out", Key: m.Key, Value: []byte("value of " + input), ID: ids[i],
					Headers: []Header{{Key: "input", Value: m.Value}, {Key: "account", Value: m.Key}}}
			}
			if err := o.Emit(ctx, tx, out...); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO a_effects (input, account, msg_id)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[])`, inputs, accounts, ids)
			return err
		}})
}

// chainStageB is stage B: a consumer of the relays' topic or queue whose
// BatchHandler records each message in b_effects, which has no unique
// constraint, so a second application would show.
func chainStageB(t *testing.T, ctx context.Context, db *pgxpool.Pool, counts *chainCounts) func(context.Context) error {
	strategy, err := idset.New(idset.Config{Table: "processed_b"})
	if err != nil {
		t.Fatal(err)
	}
	var src consumer.Source
	if q := os.Getenv(chainQueue); q != "" {
		s, err := sqs.New(ctx, sqs.Config{QueueURL: q, Client: fauxqs.Client(t), Receivers: 2, WaitTime: time.Second,
			VisibilityTimeout: 5 * time.Second, HeartbeatInterval: time.Second, Logger: consumertest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		src = s
	} else {
		src = chainKafkaSource(t, db, "stage-b", os.Getenv(chainOut))
	}
	return chainConsumer(t, ctx, db, src, consumer.Config{Name: "stage-b", Strategy: strategy, BatchSize: 200,
		Hooks: []consumer.Hook{counts}, Logger: consumertest.Logger(),
		BatchHandler: func(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
			inputs := make([]string, len(ms))
			accounts := make([]string, len(ms))
			ids := make([]string, len(ms))
			for i, m := range ms {
				input, _ := m.Header("input")
				account, _ := m.Header("account")
				if n := chainInput(string(input)); n < 0 || chainPoisonB(n) || string(m.Value) != "value of "+string(input) {
					return consumer.Permanent(fmt.Errorf("stage B refuses the message of input %q", input))
				}
				inputs[i], accounts[i], ids[i] = string(input), string(account), m.ID
			}
			_, err := tx.Exec(ctx, `INSERT INTO b_effects (input, account, msg_id)
SELECT input, account, msg_id FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS t(input, account, msg_id, ord) ORDER BY ord`,
				inputs, accounts, ids)
			return err
		}})
}

// chainRelay is a log relay or a table-polling relay to the topic or queue.
func chainRelay(t *testing.T, db *pgxpool.Pool, log bool, counts *chainCounts) func(context.Context) error {
	var sink Sink
	if q := os.Getenv(chainQueue); q != "" {
		s, err := NewSQSSink(fauxqs.Client(t), q)
		if err != nil {
			t.Fatal(err)
		}
		sink = s
	} else {
		w := &kafkago.Writer{Addr: kafkago.TCP(strings.Split(os.Getenv(chainBrokers), ",")...), Topic: os.Getenv(chainOut),
			Balancer: &kafkago.Hash{}, BatchTimeout: kafkatest.BatchTimeout, BatchSize: 1000, RequiredAcks: kafkago.RequireAll}
		s, err := NewKafkaSink(w)
		if err != nil {
			t.Fatal(err)
		}
		sink = s
	}
	sinks := map[string]Sink{"out": sink}
	if log {
		r, err := NewLogRelay(db, LogRelayConfig{Sinks: sinks, BatchSize: 500, StatusInterval: 100 * time.Millisecond,
			StandbyRetry: 100 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			Hooks: []RelayHook{counts}, Logger: consumertest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		return r.Run
	}
	r, err := NewRelay(db, RelayConfig{Sinks: sinks, BatchSize: 500, LeaseTTL: 2 * time.Second,
		PollInterval: 100 * time.Millisecond, Hooks: []RelayHook{counts}, Logger: consumertest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return r.Run
}
