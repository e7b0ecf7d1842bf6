// Package worker is the chaos test's worker program, for any Kafka source:
// a consumer.Consumer over the source a main package gives Main, with the
// idset strategy, whose batch handler writes one row per message into
// chaos.EffectsTable and rejects messages carrying chaos.PoisonHeader as
// permanently failed (so they are parked).
//
// It migrates the library's tables, prints "ready" on stdout and runs until
// SIGINT or SIGTERM (then it shuts down cleanly), SIGKILL, or the end of
// its stdin with -exit-with-stdin. It logs at info level on stderr, so that
// the driver can count the generations ("generation started") it saw.
package worker

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/integration/chaos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options are the worker's flags that configure its source.
type Options struct {
	Brokers, Topics []string
	Group           string
	// InstanceID is the worker's static group instance ID (KIP-345), ""
	// for a dynamic member: the driver gives each worker slot its own,
	// and a killed worker's replacement takes the same. A source without
	// static membership (sources/kafka: kafka-go has none) ignores it.
	InstanceID                             string
	Session, Heartbeat, Rebalance, MaxWait time.Duration
	Logger                                 *slog.Logger
}

// Source is what a worker consumes: a consumer.Source it closes at the end.
type Source interface {
	consumer.Source
	Close() error
}

// Kafka makes the worker's source over pool, and says where a message it
// delivered lies (the source package's Position).
type Kafka struct {
	New      func(pool *pgxpool.Pool, o Options) (Source, error)
	Position func(m *consumer.Message) (topic string, partition int, offset int64, ok bool)
}

type options struct {
	brokers, db, group, topics, name string
	instanceID                       string
	session, heartbeat, rebalance    time.Duration
	maxWait                          time.Duration
	batch, concurrency               int
	exitWithStdin                    bool
}

// Main parses the flags, runs the worker over k's source, and exits.
func Main(k Kafka) {
	var o options
	flag.StringVar(&o.brokers, "brokers", "", "comma-separated bootstrap brokers (required)")
	flag.StringVar(&o.db, "db", "", "PostgreSQL connection URL (required)")
	flag.StringVar(&o.group, "group", "chaos", "consumer group, also the consumer's name")
	flag.StringVar(&o.topics, "topics", "", "comma-separated topics to consume (required)")
	flag.StringVar(&o.name, "name", fmt.Sprint(os.Getpid()), "worker name, written into each effect row")
	flag.StringVar(&o.instanceID, "instance-id", "", "static group instance ID, \"\" for a dynamic member (ignored by sources without static membership)")
	flag.DurationVar(&o.session, "session-timeout", 6*time.Second, "the group's session timeout")
	flag.DurationVar(&o.heartbeat, "heartbeat-interval", 500*time.Millisecond, "the group's heartbeat interval")
	flag.DurationVar(&o.rebalance, "rebalance-timeout", 10*time.Second, "the group's rebalance timeout")
	flag.DurationVar(&o.maxWait, "max-wait", 100*time.Millisecond, "how long a fetch waits for records")
	flag.IntVar(&o.batch, "batch", 500, "consumer.Config.BatchSize")
	flag.IntVar(&o.concurrency, "concurrency", 4, "consumer.Config.Concurrency")
	flag.BoolVar(&o.exitWithStdin, "exit-with-stdin", false, "exit at once when stdin reaches end of file (the parent is gone)")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("worker", o.name)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.exitWithStdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			log.Error("stdin closed: the driver is gone, exiting")
			os.Exit(3)
		}()
	}
	if err := run(ctx, log, o, k); err != nil {
		log.Error("worker failed", "err", err)
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, o options, k Kafka) error {
	if o.brokers == "" || o.db == "" || o.topics == "" {
		return errors.New("-brokers, -db and -topics are required")
	}
	pcfg, err := pgxpool.ParseConfig(o.db)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(o.concurrency + 4)
	// The driver finds this worker's transactions in pg_stat_activity by it.
	pcfg.ConnConfig.RuntimeParams["application_name"] = chaos.ApplicationName(o.name)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	src, err := k.New(pool, Options{
		Brokers: strings.Split(o.brokers, ","), Group: o.group, Topics: strings.Split(o.topics, ","), InstanceID: o.instanceID,
		Session: o.session, Heartbeat: o.heartbeat, Rebalance: o.rebalance, MaxWait: o.maxWait,
		Logger: log,
	})
	if err != nil {
		return err
	}
	defer src.Close()
	strategy, err := idset.New(idset.Config{Logger: log})
	if err != nil {
		return err
	}
	c, err := consumer.New(pool, src, consumer.Config{
		Name:            o.group,
		Strategy:        strategy,
		BatchHandler:    apply(o.name, k.Position),
		BatchSize:       o.batch,
		Concurrency:     o.concurrency,
		RetryBackoff:    50 * time.Millisecond,
		MaxRetryBackoff: time.Second,
		Logger:          log,
	})
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx); err != nil {
		return err
	}
	fmt.Println(chaos.ReadyLine)
	err = c.Run(ctx)
	if cerr := src.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// apply returns the batch handler: a poison message fails the whole call
// permanently (the consumer bisects the batch and parks just that one);
// otherwise one effect row per message, in one statement.
func apply(worker string, position func(*consumer.Message) (string, int, int64, bool)) consumer.BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		ids := make([]string, len(msgs))
		topics := make([]string, len(msgs))
		parts := make([]int32, len(msgs))
		offs := make([]int64, len(msgs))
		for i, m := range msgs {
			if _, poison := m.Header(chaos.PoisonHeader); poison {
				return consumer.Permanent(fmt.Errorf("%s: poison message %s", m.Ref, m.DedupeKey.ID))
			}
			topic, p, off, ok := position(m)
			if !ok {
				return fmt.Errorf("%s: not a Kafka message", m.Ref)
			}
			ids[i], topics[i], parts[i], offs[i] = m.DedupeKey.ID, topic, int32(p), off
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+chaos.EffectsTable+` (msg_id, topic, partition, off, worker)
SELECT u.id, u.topic, u.part, u.off, $5 FROM unnest($1::text[], $2::text[], $3::integer[], $4::bigint[]) AS u(id, topic, part, off)`,
			ids, topics, parts, offs, worker)
		return err
	}
}
