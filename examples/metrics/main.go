// Command metrics runs a consumer and serves its Prometheus metrics on
// /metrics, while a producer publishes a steady stream of events, a few of
// them twice and a few of them malformed.
//
//	go run ./examples/metrics                  # until Ctrl-C
//	go run ./examples/metrics -duration 10s    # or for a while
//	curl -s 127.0.0.1:9090/metrics | grep ^effectively_
//
// It uses DATABASE_URL when set, else it starts a throwaway PostgreSQL. The
// broker is the in-memory consumertest.Broker, which also delivers some
// messages twice and loses some acknowledgements, so the duplicate counter
// moves too. The broker's unacknowledged messages are reported as lag.
// When it stops it prints the consumer's series from its own /metrics.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/metrics/effprom"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// options are the command's flags.
type options struct {
	listen   string
	rate     int
	duration time.Duration
	out      io.Writer
	// ready, when set, receives the address /metrics is served on.
	ready func(addr string)
}

func main() {
	o := options{out: os.Stdout}
	flag.StringVar(&o.listen, "listen", "127.0.0.1:9090", "address to serve /metrics on")
	flag.IntVar(&o.rate, "rate", 500, "events published per second")
	flag.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until interrupted)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

// handle is the business effect: one row per event. Events that say
// "malformed" are refused for good, and parked.
func handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if string(m.Value) == "malformed" {
		return consumer.Permanent(errors.New("malformed event"))
	}
	_, err := tx.Exec(ctx, `INSERT INTO metrics_example_events (event_id, body) VALUES ($1, $2)`, m.ID, m.Value)
	return err
}

func run(ctx context.Context, o options) error {
	if o.rate < 1 {
		return fmt.Errorf("-rate must be at least 1, got %d", o.rate)
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		fmt.Fprintln(o.out, "starting a throwaway PostgreSQL (set DATABASE_URL to use yours)…")
		cluster, err := pgtest.Start(context.WithoutCancel(ctx), pgtest.Options{})
		if err != nil {
			return err
		}
		defer cluster.Stop()
		url = cluster.URL()
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS metrics_example_events (event_id text NOT NULL, body bytea NOT NULL)`); err != nil {
		return err
	}

	// Metrics: the consumer's, plus the Go runtime's and the process's.
	metrics, err := effprom.New(effprom.Options{})
	if err != nil {
		return err
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	addr := ln.Addr().String()
	fmt.Fprintf(o.out, "serving http://%s/metrics\n", addr)
	if o.ready != nil {
		o.ready(addr)
	}

	strategy, err := idset.New(idset.Config{})
	if err != nil {
		return err
	}
	const name = "metrics-example"
	broker := consumertest.New(consumertest.Config{Lanes: 4, DuplicateRate: 0.05, LostAckRate: 0.01, Seed: uint64(time.Now().UnixNano())})
	c, err := consumer.New(pool, broker, consumer.Config{
		Name: name,
		// A fresh scope per run, so the example can run again on one database.
		Scope:        fmt.Sprintf("%s-%d", name, time.Now().UnixNano()),
		Strategy:     strategy,
		Handler:      handle,
		BatchSize:    100,
		RetryBackoff: 50 * time.Millisecond,
		Hooks:        []consumer.Hook{metrics},
	})
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx); err != nil {
		return err
	}

	go produce(ctx, broker, o.rate)
	go reportLag(ctx, metrics, broker, name)
	if o.duration > 0 {
		fmt.Fprintf(o.out, "consuming for %s (or until Ctrl-C)\n", o.duration)
	} else {
		fmt.Fprintln(o.out, "consuming; press Ctrl-C to stop")
	}
	runErr := c.Run(ctx)

	summary, scrapeErr := scrapeSummary(addr)
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	if runErr != nil {
		return runErr
	}
	if scrapeErr != nil {
		return scrapeErr
	}
	fmt.Fprintf(o.out, "\nstopped; the consumer's series at the end:\n%s", summary)
	return nil
}

// produce publishes rate events a second until ctx is done. Every 100th
// event is published twice, as a producer retry would; every 250th is
// malformed.
func produce(ctx context.Context, broker *consumertest.Broker, rate int) {
	const tick = 20 * time.Millisecond
	perTick := max(1, rate*int(tick)/int(time.Second))
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for range perTick {
			id := fmt.Sprintf("evt-%08d", i)
			body := []byte(fmt.Sprintf(`{"id":%q}`, id))
			if i%250 == 249 {
				body = []byte("malformed")
			}
			broker.Publish(i, consumer.Message{ID: id, Value: body})
			if i%100 == 0 {
				broker.Publish(i, consumer.Message{ID: id, Value: body})
			}
			i++
		}
	}
}

// reportLag sets the lag gauge every second. The in-memory broker knows
// only its total of unacknowledged messages; a Kafka source would report
// end offset minus committed offset per partition.
func reportLag(ctx context.Context, m *effprom.Metrics, broker *consumertest.Broker, name string) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		m.SetLag(name, "all", float64(broker.Unacked()))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrapeSummary fetches /metrics as Prometheus would and keeps the
// consumer's counters and histogram counts.
func scrapeSummary(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "effectively_") && !strings.Contains(line, "_bucket{") {
			fmt.Fprintf(&b, "  %s\n", line)
		}
	}
	return b.String(), sc.Err()
}
