// Command standbytable measures what Config.StandbyAck costs: the same
// consumer (idset, a BatchHandler writing one ledger row per message with
// one unnest statement) on a throwaway primary with a streaming standby
// (pgtest.StartReplicated, fsync and synchronous_commit on), with
// asynchronous replication and StandbyAck off, on (flushed) and on
// (replayed), and with synchronous replication (the standby in
// synchronous_standby_names) and StandbyAck off, side by side in one run,
// the modes interleaved run by run. It prints a Markdown table of
// messages per second, their ratio to asynchronous replication without
// StandbyAck, and the batches' latency from fetch to acknowledgement
// (median and 99th percentile), with the time a batch waited for its
// standby.
//
//	go run ./bench/cmd/standbytable [-messages 20000] [-runs 3] [-lanes 4] [-batch 100]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type mode struct {
	name string
	sync bool
	ack  standby.Config
}

var modes = []mode{
	{name: "asynchronous, StandbyAck off"},
	{name: "asynchronous, StandbyAck 1 standby flushed", ack: standby.Config{Standbys: 1, Timeout: time.Minute}},
	{name: "asynchronous, StandbyAck 1 standby replayed", ack: standby.Config{Standbys: 1, Replayed: true, Timeout: time.Minute}},
	{name: "synchronous (synchronous_commit = on), StandbyAck off", sync: true},
}

type result struct {
	rate           float64 // messages per second
	p50, p99, wait time.Duration
}

func main() {
	messages := flag.Int("messages", 20000, "messages per run")
	runs := flag.Int("runs", 3, "runs per mode; the median is reported")
	lanes := flag.Int("lanes", 4, "lanes (Config.Concurrency)")
	batch := flag.Int("batch", 100, "batch size")
	flag.Parse()
	if err := run(*messages, *runs, *lanes, *batch); err != nil {
		fmt.Fprintln(os.Stderr, "standbytable:", err)
		os.Exit(1)
	}
}

func run(n, runs, lanes, batch int) error {
	ctx := context.Background()
	r, err := pgtest.StartReplicated(ctx, pgtest.ReplicaOptions{Fsync: true})
	if err != nil {
		return err
	}
	defer r.Stop()
	url, err := r.CreateDatabase(ctx, "bench")
	if err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(lanes + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := bench.Setup(ctx, pool); err != nil {
		return err
	}
	results := make([][]result, len(modes))
	for i := range runs {
		for m, md := range modes {
			if err := replication(ctx, r, md.sync); err != nil {
				return err
			}
			if err := bench.Reset(ctx, pool); err != nil {
				return err
			}
			res, err := once(ctx, pool, md, n, lanes, batch)
			if err != nil {
				return fmt.Errorf("%s: %w", md.name, err)
			}
			fmt.Fprintf(os.Stderr, "run %d/%d, %s: %.0f msg/s, batch p50 %s p99 %s, standby wait %s\n",
				i+1, runs, md.name, res.rate, res.p50, res.p99, res.wait)
			results[m] = append(results[m], res)
		}
	}
	if err := replication(ctx, r, false); err != nil {
		return err
	}
	fmt.Printf("%d messages per run, %d lanes, batch %d, BatchHandler, idset; primary and one streaming standby on this machine, fsync on; median of %d runs, modes interleaved\n\n",
		n, lanes, batch, runs)
	fmt.Println("| replication, setting | msgs/s | ratio | batch latency p50 | p99 | added p50 | standby wait (mean) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	base := median(results[0])
	for m, md := range modes {
		res := median(results[m])
		fmt.Printf("| %s | %.0f | %.2f | %s | %s | %+.1fms | %s |\n", md.name, res.rate, res.rate/base.rate,
			ms(res.p50), ms(res.p99), float64(res.p50-base.p50)/1e6, ms(res.wait))
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

// median takes each column's median over the runs.
func median(rs []result) result {
	col := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return result{
		rate: col(func(r result) float64 { return r.rate }),
		p50:  time.Duration(col(func(r result) float64 { return float64(r.p50) })),
		p99:  time.Duration(col(func(r result) float64 { return float64(r.p99) })),
		wait: time.Duration(col(func(r result) float64 { return float64(r.wait) })),
	}
}

// replication makes the standby synchronous (synchronous_standby_names)
// or asynchronous, and returns once the primary says so.
func replication(ctx context.Context, r *pgtest.Replicated, sync bool) error {
	conn, err := pgx.Connect(ctx, r.Primary.URL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	names, want := "", "async"
	if sync {
		names, want = pgtest.StandbyName, "sync"
	}
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+names+"'"); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var state string
		if err := conn.QueryRow(ctx, `SELECT coalesce((SELECT sync_state FROM pg_stat_replication LIMIT 1), '')`).Scan(&state); err != nil {
			return err
		}
		if state == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby is %q after a minute, want %q", state, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// latencies is a hook keeping each batch's total time and standby wait.
type latencies struct {
	mu          sync.Mutex
	total       []time.Duration
	wait        time.Duration
	unconfirmed int
}

func (l *latencies) BatchDone(_ context.Context, st *consumer.BatchStats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total = append(l.total, st.Total)
	l.wait += st.Standby
	if st.StandbyUnconfirmed {
		l.unconfirmed++
	}
}

var _ consumer.Hook = (*latencies)(nil)

// once runs n messages through a consumer in mode md.
func once(ctx context.Context, pool *pgxpool.Pool, md mode, n, lanes, batch int) (result, error) {
	broker := consumertest.New(consumertest.Config{Lanes: lanes})
	for i := range n {
		broker.Publish(i%lanes, consumer.Message{ID: fmt.Sprintf("m-%d", i), Value: []byte(`{}`)})
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		return result{}, err
	}
	lat := &latencies{}
	c, err := consumer.New(pool, broker, consumer.Config{
		Name: "bench", Strategy: strategy, BatchSize: batch, Concurrency: lanes,
		BatchHandler: func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.ID
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger (msg_id, account, amount) SELECT id, 'a', 1 FROM unnest($1::text[]) AS id`, ids)
			return err
		},
		StandbyAck: md.ack,
		Hooks:      []consumer.Hook{lat},
	})
	if err != nil {
		return result{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(runCtx) }()
	if err := broker.WaitIdle(ctx); err != nil {
		return result{}, err
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return result{}, err
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		return result{}, err
	}
	if rows != n {
		return result{}, fmt.Errorf("ledger has %d rows after %d messages", rows, n)
	}
	lat.mu.Lock()
	defer lat.mu.Unlock()
	if lat.unconfirmed > 0 {
		return result{}, fmt.Errorf("%d batches acknowledged unconfirmed", lat.unconfirmed)
	}
	slices.Sort(lat.total)
	return result{
		rate: float64(n) / elapsed.Seconds(),
		p50:  lat.total[len(lat.total)/2],
		p99:  lat.total[len(lat.total)*99/100],
		wait: lat.wait / time.Duration(len(lat.total)),
	}, nil
}
