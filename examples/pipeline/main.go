// Command pipeline is a two-stage pipeline, effectively-once end to end,
// with its parts killed and restarted while it runs.
//
// Stage A consumes transfers from a Kafka topic (sources/kafka), writes two
// ledger rows per transfer and, in the same transaction, emits one balance
// change per row through the outbox (outbox.Emit, IDs derived from the
// input with outbox.ID). A relay publishes the committed changes to a second
// topic; stage B consumes that topic (sources/kafka again, which dedupes by
// the relay's "idempotency-key" header with no configuration) and keeps a
// balance table.
//
// While it runs, a chaos loop kills one part at a time and starts it
// again: one of stage A's two workers or stage B (their shutdown timeout is
// a nanosecond, so the batch in flight is abandoned, like a crash), or the
// relay (its context cancelled). At the end it checks that every account's
// balance in stage B's table equals the sum of that account's transfers,
// prints a report and exits non-zero otherwise.
//
//	go run ./examples/pipeline
//
// It runs on an embedded Kafka (franz-go's kfake, in-process; KAFKA_BROKERS
// to use yours) and a throwaway PostgreSQL (DATABASE_URL to use yours).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// Transfer is the payload of one input message.
type Transfer struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

const schema = `
CREATE TABLE IF NOT EXISTS pipeline_ledger (
    run text NOT NULL, transfer_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS pipeline_balances (
    run text NOT NULL, account text NOT NULL, balance bigint NOT NULL, changes bigint NOT NULL,
    PRIMARY KEY (run, account)
);`

var accounts = []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"}

func main() {
	n := flag.Int("n", 10000, "number of transfers")
	verbose := flag.Bool("v", false, "log what the consumers and the relay do")
	flag.Parse()
	if err := run(context.Background(), *n, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
}

// counts adds up the outcomes a consumer's batches report.
type counts struct{ applied, duplicate, parked atomic.Int64 }

func (c *counts) BatchDone(_ context.Context, s *consumer.BatchStats) {
	c.applied.Add(int64(s.Applied))
	c.duplicate.Add(int64(s.Duplicate + s.Mismatch))
	c.parked.Add(int64(s.Parked))
}

// part is one killable piece of the pipeline: start runs it until its
// context is done.
type part struct {
	name           string
	start          func(ctx context.Context) error
	kills, restart int
	cancel         context.CancelFunc
	done           chan error
}

func (p *part) up(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(ctx)
	p.done = make(chan error, 1)
	go func() { p.done <- p.start(ctx) }()
}

// down stops the part; a crash-style stop of a consumer returns
// ErrShutdownTimeout, which is what it is for.
func (p *part) down() error {
	p.cancel()
	if err := <-p.done; err != nil && !errors.Is(err, consumer.ErrShutdownTimeout) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	return nil
}

func run(ctx context.Context, n int, verbose bool) error {
	// The kills make the consumers log rolled-back batches: quiet unless -v.
	log := slog.New(slog.DiscardHandler)
	if verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}

	cluster, err := kafkatest.Start() // KAFKA_BROKERS, or an embedded cluster
	if err != nil {
		return err
	}
	defer cluster.Close()
	embedded := cluster.Fake() != nil
	pool, closeDB, err := pgtest.EnvPool(ctx, pgtest.Options{}, nil) // DATABASE_URL, or a throwaway server
	if err != nil {
		return err
	}
	defer closeDB()
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("schema: %w", err)
	}

	// A fresh run name (topics, groups, rows) per run, so it can run again
	// on the same database and cluster.
	runName := kafkatest.Name("pipeline")
	inTopic, outTopic := runName+"-transfers", runName+"-balance-changes"
	if embedded {
		for _, t := range []string{inTopic, outTopic} {
			if err := cluster.CreateTopic(ctx, t, 4); err != nil {
				return err
			}
		}
	}
	msgs, want := transfers(n)
	fmt.Printf("producing %d messages to %s in %d waves: %d transfers, every 25th sent twice\n", len(msgs), inTopic, waves, n)
	in := &kafkago.Writer{Addr: kafkago.TCP(cluster.Brokers()...), Topic: inTopic, Balancer: &kafkago.Hash{},
		BatchTimeout: kafkatest.BatchTimeout, BatchSize: 1000, RequiredAcks: kafkago.RequireAll}
	defer in.Close()

	// TableMode: the outbox is read by the table-polling Relay below, which
	// needs the per-key counter TableMode takes to keep a key's messages in
	// commit order. An outbox read by a LogRelay leaves Mode at LogMode.
	ob, err := outbox.New(outbox.Config{Sinks: []string{"balance-changes"}, Mode: outbox.TableMode})
	if err != nil {
		return err
	}
	if _, err := pg.Migrate(ctx, pool, "", ob.Line()); err != nil {
		return err
	}

	kcfg := func(group, topic string) kafka.Config {
		cfg := kafka.Config{Brokers: cluster.Brokers(), Group: group, Topics: []string{topic}, Logger: log}
		if embedded {
			cfg.MaxWait = kafkatest.MaxWait
			cfg.SessionTimeout = kafkatest.SessionTimeout
			cfg.HeartbeatInterval = kafkatest.HeartbeatInterval
			cfg.RebalanceTimeout = 5 * time.Second
			cfg.JoinGroupBackoff = 200 * time.Millisecond
		}
		return cfg
	}
	// consume runs one consumer over topic until ctx is done, with a
	// nanosecond shutdown timeout: a stop is a crash.
	consume := func(ctx context.Context, group, topic string, cfg consumer.Config) error {
		src, err := kafka.New(pool, kcfg(group, topic))
		if err != nil {
			return err
		}
		defer src.Close()
		cfg.Logger, cfg.ShutdownTimeout = log, time.Nanosecond
		c, err := consumer.New(pool, src, cfg)
		if err != nil {
			return err
		}
		if err := c.Migrate(ctx); err != nil {
			return err
		}
		return c.Run(ctx)
	}

	// Stage A: two ledger rows and two balance changes per transfer, in one
	// transaction per batch (one statement for the rows, one for the emits).
	stratA, err := idset.New(idset.Config{Table: "pipeline_processed_a"})
	if err != nil {
		return err
	}
	countsA := &counts{}
	stageA := consumer.Config{Name: runName + "-a", Strategy: stratA, BatchSize: 200, Hooks: []consumer.Hook{countsA},
		BatchHandler: func(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
			var ids, accts []string
			var amounts []int64
			var out []outbox.Message
			for _, m := range ms {
				var t Transfer
				if err := json.Unmarshal(m.Value, &t); err != nil {
					return &consumer.DecodeError{Err: err}
				}
				for i, e := range []struct {
					acct string
					amt  int64
				}{{t.From, -t.Amount}, {t.To, t.Amount}} {
					ids, accts, amounts = append(ids, t.ID), append(accts, e.acct), append(amounts, e.amt)
					out = append(out, outbox.Message{Sink: "balance-changes", Key: []byte(e.acct),
						Value: []byte(strconv.FormatInt(e.amt, 10)), ID: outbox.ID(m, i)})
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO pipeline_ledger (run, transfer_id, account, amount)
SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[])`, runName, ids, accts, amounts); err != nil {
				return err
			}
			return ob.Emit(ctx, tx, out...)
		}}

	// The relay, publishing to outTopic. The sink takes its settings from
	// a kafka-go Writer and sends its own requests: it needs a balancer
	// that keeps a key on one partition and the broker's acknowledgement
	// (RequiredAcks left zero is RequireNone, which it refuses); BatchSize
	// is the most messages in one request.
	w := &kafkago.Writer{Addr: kafkago.TCP(cluster.Brokers()...), Topic: outTopic, Balancer: &kafkago.Hash{},
		BatchSize: 1000, RequiredAcks: kafkago.RequireAll}
	sink, err := outbox.NewKafkaSink(w)
	if err != nil {
		return err
	}
	relay := func(ctx context.Context) error {
		r, err := outbox.NewRelay(pool, outbox.RelayConfig{Sinks: map[string]outbox.Sink{"balance-changes": sink},
			LeaseTTL: 2 * time.Second, BatchSize: 500, Logger: log})
		if err != nil {
			return err
		}
		return r.Run(ctx)
	}

	// Stage B: the balance table.
	stratB, err := idset.New(idset.Config{Table: "pipeline_processed_b"})
	if err != nil {
		return err
	}
	countsB := &counts{}
	stageB := consumer.Config{Name: runName + "-b", Strategy: stratB, BatchSize: 200, Hooks: []consumer.Hook{countsB},
		// One upsert per message, queued: the batch's upserts go in one
		// round trip. (One unnest upsert for the batch would not do: a
		// batch holds several changes of one account, and ON CONFLICT
		// cannot update a row twice in one statement.)
		QueueHandler: func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
			amt, err := strconv.ParseInt(string(m.Value), 10, 64)
			if err != nil {
				return &consumer.DecodeError{Err: err}
			}
			q.Queue(`INSERT INTO pipeline_balances VALUES ($1, $2, $3, 1)
ON CONFLICT (run, account) DO UPDATE SET balance = pipeline_balances.balance + $3, changes = pipeline_balances.changes + 1`,
				runName, string(m.Key), amt)
			return nil
		}}

	parts := []*part{
		{name: "stage A worker 1", start: func(ctx context.Context) error { return consume(ctx, runName+"-a", inTopic, stageA) }},
		{name: "stage A worker 2", start: func(ctx context.Context) error { return consume(ctx, runName+"-a", inTopic, stageA) }},
		{name: "relay 1", start: relay},
		{name: "relay 2", start: relay},
		{name: "stage B", start: func(ctx context.Context) error { return consume(ctx, runName+"-b", outTopic, stageB) }},
	}
	for _, p := range parts {
		p.up(ctx)
	}
	var once sync.Once
	stopAll := func() (err error) {
		once.Do(func() {
			for _, p := range parts {
				if e := p.down(); e != nil && err == nil {
					err = e
				}
			}
		})
		return err
	}
	defer func() { _ = stopAll() }()

	// The transfers go in in waves; a little while after each wave is
	// written (while it is being worked on), one part is killed and started
	// again, round robin, so each part dies several times mid-stream.
	start := time.Now()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 15))
	for w := range waves {
		if err := in.WriteMessages(ctx, msgs[w*len(msgs)/waves:(w+1)*len(msgs)/waves]...); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		time.Sleep(time.Duration(20+rng.IntN(200)) * time.Millisecond) // chaos timing, not a wait for an event
		p := parts[w%len(parts)]
		if err := p.down(); err != nil {
			return err
		}
		p.kills++
		p.up(ctx)
		p.restart++
	}

	// Then wait until stage B has applied every change: a minute, plus
	// one per 10,000 transfers, at most.
	deadline := time.After(time.Minute + time.Duration(n)*6*time.Millisecond)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-deadline:
			return fmt.Errorf("not settled after %s: stage B applied %d of %d changes", time.Since(start).Round(time.Second), countsB.applied.Load(), 2*n)
		case <-tick.C:
			var c int64
			if err := pool.QueryRow(ctx, `SELECT coalesce(sum(changes), 0) FROM pipeline_balances WHERE run = $1`, runName).Scan(&c); err != nil {
				return err
			}
			done = c >= int64(2*n)
		}
	}
	elapsed := time.Since(start)
	if err := stopAll(); err != nil {
		return err
	}
	return check(ctx, pool, ob, runName, n, len(msgs), want, parts, countsA, countsB, elapsed)
}

// waves is how many parts the input is written in; a part is killed after
// each.
const waves = 20

// transfers returns n transfers, keyed by the paying account, every 25th
// twice (a producer's retry), and the balances they make.
func transfers(n int) ([]kafkago.Message, map[string]int64) {
	want := map[string]int64{}
	var msgs []kafkago.Message
	for i := range n {
		t := Transfer{ID: fmt.Sprintf("tr-%06d", i), From: accounts[i%len(accounts)], To: accounts[(i*7+3)%len(accounts)], Amount: int64(1 + i%997)}
		if t.From == t.To {
			t.To = accounts[(i+1)%len(accounts)]
		}
		want[t.From] -= t.Amount
		want[t.To] += t.Amount
		body, _ := json.Marshal(t)
		m := kafkago.Message{Key: []byte(t.From), Value: body, Headers: []kafkago.Header{{Key: kafka.DefaultIDHeader, Value: []byte(t.ID)}}}
		msgs = append(msgs, m)
		if i%25 == 0 {
			msgs = append(msgs, m)
		}
	}
	return msgs, want
}

// check compares stage B's balances with the transfers' sums, and the
// ledger's, and prints the report.
func check(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, runName string, n, produced int, want map[string]int64,
	parts []*part, countsA, countsB *counts, elapsed time.Duration) error {
	got := map[string]int64{}
	rows, err := pool.Query(ctx, `SELECT account, balance FROM pipeline_balances WHERE run = $1`, runName)
	if err != nil {
		return err
	}
	for rows.Next() {
		var a string
		var b int64
		if err := rows.Scan(&a, &b); err != nil {
			return err
		}
		got[a] = b
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var ledgerRows, transfers int
	var changes int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(changes), 0) FROM pipeline_balances WHERE run = $1`, runName).Scan(&changes); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT transfer_id) FROM pipeline_ledger WHERE run = $1`, runName).Scan(&ledgerRows, &transfers); err != nil {
		return err
	}
	// The outbox's rows still to publish, and those a sink refused, from
	// its Stats.
	st, err := ob.Stats(ctx, pool)
	if err != nil {
		return err
	}
	var waiting, refused int64
	for _, s := range st.Sinks {
		waiting += s.Waiting
		refused += s.Parked
	}
	// The messages the two stages parked, from the parked table's store:
	// the rows of their scopes (their Names, by default).
	parkedStore := parked.NewStore(pool, "", "")
	var parkedRows int64
	for _, stage := range []string{runName + "-a", runName + "-b"} {
		c, err := parkedStore.Count(ctx, parked.Filter{Scope: stage})
		if err != nil {
			return err
		}
		parkedRows += c
	}

	fmt.Printf("settled in %s\n", elapsed.Round(time.Millisecond))
	fmt.Printf("  inputs                 %7d messages (%d transfers)\n", produced, n)
	fmt.Printf("  stage A applied        %7d   duplicates dropped %5d\n", countsA.applied.Load(), countsA.duplicate.Load())
	fmt.Printf("  stage B applied        %7d   duplicates dropped %5d (relay republishes and redeliveries)\n", countsB.applied.Load(), countsB.duplicate.Load())
	for _, p := range parts {
		fmt.Printf("  %-22s %3d kills, %3d restarts\n", p.name, p.kills, p.restart)
	}
	var problems []string
	if transfers != n || ledgerRows != 2*n {
		problems = append(problems, fmt.Sprintf("stage A booked %d transfers in %d ledger rows, want %d in %d", transfers, ledgerRows, n, 2*n))
	}
	if changes != int64(2*n) {
		problems = append(problems, fmt.Sprintf("stage B applied %d balance changes, want %d", changes, 2*n))
	}
	if waiting != 0 || refused != 0 {
		problems = append(problems, fmt.Sprintf("outbox rows unpublished: %d waiting, %d parked", waiting, refused))
	}
	if parkedRows != 0 {
		problems = append(problems, fmt.Sprintf("%d messages parked", parkedRows))
	}
	for _, a := range accounts {
		if got[a] != want[a] {
			problems = append(problems, fmt.Sprintf("%s: balance %d, transfers sum to %d", a, got[a], want[a]))
		}
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Println("  FAIL:", p)
		}
		return fmt.Errorf("check failed: %d problems", len(problems))
	}
	fmt.Printf("check passed: all %d balances equal the sums of their transfers\n", len(accounts))
	return nil
}
