package effprom_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/metrics/effprom"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Wire the metrics into a consumer and serve them.
func ExampleNew() {
	var pool *pgxpool.Pool                                            // your database
	var src consumer.Source = consumertest.New(consumertest.Config{}) // your Kafka or SQS source

	metrics, err := effprom.New(effprom.Options{ConstLabels: map[string]string{"service": "billing"}})
	if err != nil {
		log.Fatal(err)
	}
	strategy, err := highwater.New(highwater.Config{Mode: highwater.Monotonic})
	if err != nil {
		log.Fatal(err)
	}
	// Export the strategy's cache and gap counters too (any strategy that
	// implements dedupe.StatsReporter).
	strategies, err := effprom.NewStrategies(effprom.Options{ConstLabels: map[string]string{"service": "billing"}})
	if err != nil {
		log.Fatal(err)
	}
	if err := strategies.Watch("payments", strategy); err != nil {
		log.Fatal(err)
	}
	registry := prom.NewRegistry()
	registry.MustRegister(metrics, strategies)
	http.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))

	_, err = consumer.New(pool, src, consumer.Config{
		Name:     "payments",
		Strategy: strategy,
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			return nil // apply m with tx
		},
		Hooks: []consumer.Hook{metrics},
	})
	_ = err
}

// Report lag per lane from wherever it is known.
func ExampleMetrics_SetLag() {
	metrics, err := effprom.New(effprom.Options{})
	if err != nil {
		log.Fatal(err)
	}
	registry := prom.NewRegistry()
	registry.MustRegister(metrics)

	// A Kafka source would compare each partition's end offset with the
	// offset the consumer committed, every few seconds.
	metrics.SetLag("payments", "payments/0", 120)
	metrics.SetLag("payments", "payments/1", 4)
	// Partition 1 moved to another process after a rebalance.
	metrics.DeleteLag("payments", "payments/1")

	families, err := registry.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			fmt.Println(mf.GetName(), m.GetLabel()[1].GetValue(), m.GetGauge().GetValue())
		}
	}
	// Output:
	// effectively_lag_messages payments/0 120
}
