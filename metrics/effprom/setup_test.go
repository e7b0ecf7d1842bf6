package effprom_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	prom "github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newPool returns a fresh database with the effects table.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewPool(t)
	// No unique constraint: a second effect of one message must be countable.
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (msg_id text NOT NULL, payload bytea NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

func insertEffect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, payload) VALUES ($1, $2)`, m.ID, m.Value)
	return err
}

// run runs a consumer on broker until the broker is idle.
func run(t *testing.T, pool *pgxpool.Pool, broker *consumertest.Broker, cfg consumer.Config) {
	t.Helper()
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = time.Millisecond
		cfg.MaxRetryBackoff = 5 * time.Millisecond
	}
	consumertest.RunUntilIdle(t, consumertest.NewConsumer(t, pool, broker, cfg), broker, 60*time.Second)
}

// effects returns the number of effect rows and of distinct messages.
func effects(t *testing.T, pool *pgxpool.Pool) (rows, distinct int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT msg_id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// scrape gathers reg into families by name.
type scrape map[string]*dto.MetricFamily

func gather(t *testing.T, reg prom.Gatherer) scrape {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	s := scrape{}
	for _, mf := range mfs {
		s[mf.GetName()] = mf
	}
	return s
}

// find returns the series of family name whose labels include want
// ("k=v" pairs), failing the test unless there is exactly one.
func (s scrape) find(t *testing.T, name string, want ...string) *dto.Metric {
	t.Helper()
	mf, ok := s[name]
	if !ok {
		t.Fatalf("no metric family %s", name)
	}
	var found []*dto.Metric
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		match := true
		for _, kv := range want {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				match = false
			}
		}
		if match {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s{%s}: %d series match, want 1", name, strings.Join(want, ","), len(found))
	}
	return found[0]
}

// value returns a counter's or gauge's value.
func (s scrape) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	m := s.find(t, name, labels...)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("%s is neither a counter nor a gauge", name)
	return math.NaN()
}

// histogram returns a histogram's sample count and sum.
func (s scrape) histogram(t *testing.T, name string, labels ...string) (count uint64, sum float64) {
	t.Helper()
	m := s.find(t, name, labels...)
	if m.Histogram == nil {
		t.Fatalf("%s is not a histogram", name)
	}
	return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
}

func id(prefix string, i int) string { return fmt.Sprintf("%s-%04d", prefix, i) }

func fmtSscanf(s, format string, a ...any) (int, error) { return fmt.Sscanf(s, format, a...) }
