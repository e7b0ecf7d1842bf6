package effprom_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/metrics/effprom"
	"github.com/jackc/pgx/v5"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCountersMatchKnownTraffic publishes a known mix of messages (new ones,
// producer duplicates, reused keys with another payload, poison messages,
// transient failures, and one batch whose commit fails) and checks every
// counter of a scrape against it, exactly.
func TestCountersMatchKnownTraffic(t *testing.T) {
	t.Parallel()
	const (
		n          = 300 // distinct messages
		dups       = 25  // producer duplicates: same ID and payload again
		mismatches = 5   // same ID, another payload
		poison     = 8   // refused by the handler: parked
		transient  = 5   // fail once, then apply
		lanes      = 4   // lanes for the messages above; the bomb has its own
	)
	pool := newPool(t)
	ctx := context.Background()
	// A deferred trigger lets a handler make the commit itself fail with a
	// serialization failure, a transient refusal: the whole batch rolls back
	// and is delivered again.
	if _, err := pool.Exec(ctx, `CREATE TABLE bomb (k text);
		CREATE FUNCTION bomb() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = 'serialization_failure'; END $$;
		CREATE CONSTRAINT TRIGGER bomb AFTER INSERT ON bomb DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION bomb()`); err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{Lanes: lanes + 1})

	// Message i goes to lane i%lanes. The sets are disjoint: poison
	// i%40==3, transient i%60==10, duplicated i%12==1, mismatched i%60==5.
	isPoison := func(i int) bool { return i%40 == 3 }
	isTransient := func(i int) bool { return i%60 == 10 }
	var gotPoison, gotTransient int
	for i := range n {
		body := "payload " + id("m", i)
		if isPoison(i) {
			body = "poison"
			gotPoison++
		}
		if isTransient(i) {
			gotTransient++
		}
		broker.Publish(i%lanes, consumer.Message{ID: id("m", i), Value: []byte(body)})
	}
	if gotPoison != poison || gotTransient != transient {
		t.Fatalf("test setup: %d poison, %d transient", gotPoison, gotTransient)
	}
	for k, i := 0, 1; k < dups; k, i = k+1, i+12 {
		broker.Publish(i%lanes, consumer.Message{ID: id("m", i), Value: []byte("payload " + id("m", i))})
	}
	for k, i := 0, 5; k < mismatches; k, i = k+1, i+60 {
		broker.Publish(i%lanes, consumer.Message{ID: id("m", i), Value: []byte("another payload")})
	}
	// The bomb's lane: a few ordinary messages and one whose first
	// attempt breaks the commit.
	for i := range 5 {
		broker.Publish(lanes, consumer.Message{ID: id("b", i), Value: []byte("bomb lane")})
	}

	var mu sync.Mutex
	failed := map[string]bool{}
	firstTime := func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		if failed[id] {
			return false
		}
		failed[id] = true
		return true
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if string(m.Value) == "poison" {
			return consumer.Permanent(errors.New("poison"))
		}
		var i int
		if _, err := fmtSscanf(m.ID, "m-%d", &i); err == nil && isTransient(i) && firstTime(m.ID) {
			return errors.New("transient failure")
		}
		if m.ID == id("b", 2) && firstTime(m.ID) {
			if _, err := tx.Exec(ctx, `INSERT INTO bomb VALUES ('x')`); err != nil {
				return err
			}
		}
		return insertEffect(ctx, tx, m)
	}

	metrics, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(metrics)
	stats := &consumertest.Counter{}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, pool, broker, consumer.Config{
		Name: "orders", Strategy: strategy, Handler: handler, BatchSize: 20,
		Hooks: []consumer.Hook{metrics, stats},
	})

	s := gather(t, reg)
	msgs := func(outcome string) float64 {
		return s.value(t, "effectively_messages_total", "consumer=orders", "outcome="+outcome)
	}
	wantApplied := n - poison + 5
	for _, c := range []struct {
		outcome string
		want    int
	}{
		{"applied", wantApplied},
		{"duplicate", dups},
		{"mismatch", mismatches},
		{"parked", poison},
		{"retried", transient},
		{"gap", 0},
	} {
		if got := msgs(c.outcome); got != float64(c.want) {
			t.Errorf("messages_total{outcome=%q} = %v, want %d", c.outcome, got, c.want)
		}
	}
	if got := s.value(t, "effectively_parked_total", "consumer=orders", "reason=permanent"); got != poison {
		t.Errorf("parked_total{reason=permanent} = %v, want %d", got, poison)
	}
	// The promise, seen from the database.
	if rows, distinct := effects(t, pool); rows != wantApplied || distinct != wantApplied {
		t.Errorf("effects: %d rows for %d messages, want %d of each", rows, distinct, wantApplied)
	}

	// Batches: the scrape agrees with the consumer's own reports, and one
	// batch rolled back.
	sum := stats.Total()
	results := map[string]int{"ok": sum.OK, "isolated": sum.Isolated, "fenced": sum.Fenced, "error": sum.Failed}
	var batches float64
	for _, r := range []string{"ok", "isolated", "fenced", "error"} {
		got := s.value(t, "effectively_batches_total", "consumer=orders", "result="+r)
		if got != float64(results[r]) {
			t.Errorf("batches_total{result=%q} = %v, want %d", r, got, results[r])
		}
		batches += got
	}
	if results["error"] != 1 || results["fenced"] != 0 {
		t.Errorf("batch results %v: want exactly one error (the failed commit) and no fenced", results)
	}
	if batches == 0 {
		t.Fatal("no batches counted")
	}
	// Handler re-runs while failures were isolated: the scrape agrees with
	// the batches' own counts.
	var reruns int
	for _, b := range stats.Batches() {
		reruns += b.Reruns
	}
	if got := s.value(t, "effectively_handler_reruns_total", "consumer=orders"); got != float64(reruns) {
		t.Errorf("handler_reruns_total = %v, want %d (the sum of BatchStats.Reruns)", got, reruns)
	}
	delivered := broker.Stats().Delivered
	if count, total := s.histogram(t, "effectively_batch_size", "consumer=orders"); count != uint64(batches) || total != float64(delivered) || sum.Size != delivered {
		t.Errorf("batch_size: %d batches of %v messages in all; want %v batches, %d deliveries", count, total, batches, delivered)
	}
	if count, _ := s.histogram(t, "effectively_batch_duration_seconds", "consumer=orders"); count != uint64(batches) {
		t.Errorf("batch_duration_seconds count %d, want %v", count, batches)
	}
	settled := uint64(results["ok"] + results["isolated"])
	for _, h := range []string{"effectively_commit_duration_seconds", "effectively_ack_duration_seconds"} {
		if count, total := s.histogram(t, h, "consumer=orders"); count != settled || total <= 0 {
			t.Errorf("%s: count %d sum %v, want count %d (committed batches) and a positive sum", h, count, total, settled)
		}
	}
	// Handlers also ran in the batch whose commit failed.
	if count, total := s.histogram(t, "effectively_handle_duration_seconds", "consumer=orders"); count != settled+1 || total <= 0 {
		t.Errorf("handle_duration_seconds: count %d sum %v, want count %d", count, total, settled+1)
	}
	if count, _ := s.histogram(t, "effectively_claim_duration_seconds", "consumer=orders", "strategy=idset"); count < settled {
		t.Errorf("claim_duration_seconds{strategy=idset} count %d, want at least %d", count, settled)
	}
	if count, total := s.histogram(t, "effectively_message_age_seconds", "consumer=orders"); count != uint64(wantApplied) || total <= 0 {
		t.Errorf("message_age_seconds: count %d sum %v, want count %d", count, total, wantApplied)
	}

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestCountersUnderRedelivery runs through a broker that duplicates
// deliveries and loses acknowledgements: every delivery is counted under
// exactly one outcome, and applied and parked stay exact.
func TestCountersUnderRedelivery(t *testing.T) {
	t.Parallel()
	const n, poison = 400, 8
	pool := newPool(t)
	broker := consumertest.New(consumertest.Config{Lanes: 4, DuplicateRate: 0.3, LostAckRate: 0.05, Seed: 7})
	for i := range n {
		body := "payload"
		if i%50 == 0 {
			body = "poison"
		}
		broker.Publish(i, consumer.Message{ID: id("m", i), Value: []byte(body)})
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if string(m.Value) == "poison" {
			return consumer.Permanent(errors.New("poison"))
		}
		return insertEffect(ctx, tx, m)
	}
	metrics, err := effprom.New(effprom.Options{Namespace: "acme", ConstLabels: map[string]string{"service": "billing"}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(metrics)
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, pool, broker, consumer.Config{Name: "ledger", Strategy: strategy, Handler: handler, BatchSize: 25, Hooks: []consumer.Hook{metrics}})

	s := gather(t, reg)
	var all float64
	got := map[string]float64{}
	for _, o := range []string{"applied", "duplicate", "mismatch", "parked", "retried"} {
		got[o] = s.value(t, "acme_messages_total", "consumer=ledger", "outcome="+o, "service=billing")
		all += got[o]
	}
	bs := broker.Stats()
	if got["applied"] != n-poison || got["parked"] != poison {
		t.Errorf("applied %v parked %v, want %d and %d", got["applied"], got["parked"], n-poison, poison)
	}
	if got["duplicate"] == 0 || bs.Duplicated == 0 {
		t.Errorf("duplicates counted %v, broker duplicated %d: the test needs some", got["duplicate"], bs.Duplicated)
	}
	if all != float64(bs.Delivered) {
		t.Errorf("outcomes sum to %v, broker delivered %d", all, bs.Delivered)
	}
	if rows, distinct := effects(t, pool); rows != n-poison || distinct != n-poison {
		t.Errorf("effects: %d rows for %d messages, want %d", rows, distinct, n-poison)
	}
}

func TestLag(t *testing.T) {
	t.Parallel()
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	m.SetLag("orders", "orders/0", 12)
	m.SetLag("orders", "orders/1", 3)
	m.SetLag("orders", "orders/0", 40)
	s := gather(t, reg)
	if got := s.value(t, "effectively_lag_messages", "consumer=orders", "lane=orders/0"); got != 40 {
		t.Errorf("lag of orders/0 = %v, want 40", got)
	}
	if !m.DeleteLag("orders", "orders/1") || m.DeleteLag("orders", "orders/1") {
		t.Error("DeleteLag should report true once, then false")
	}
	if n := len(gather(t, reg)["effectively_lag_messages"].GetMetric()); n != 1 {
		t.Errorf("%d lag series after DeleteLag, want 1", n)
	}
}

// ReportLag follows a lag function: values are updated, and the series of
// a lane the function stops reporting (a partition read elsewhere) goes away.
func TestReportLag(t *testing.T) {
	t.Parallel()
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	var mu sync.Mutex
	current := map[string]int64{"orders/0": 7, "orders/1": 2}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.ReportLag(ctx, "orders", 100*time.Millisecond, func() map[string]int64 {
			mu.Lock()
			defer mu.Unlock()
			out := map[string]int64{}
			for k, v := range current {
				out[k] = v
			}
			return out
		})
	}()
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	lag := func(lane string) float64 {
		for _, mt := range gather(t, reg)["effectively_lag_messages"].GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "lane" && l.GetValue() == lane {
					return mt.GetGauge().GetValue()
				}
			}
		}
		return -1
	}
	waitUntil("the first values", func() bool { return lag("orders/0") == 7 && lag("orders/1") == 2 })
	mu.Lock()
	current = map[string]int64{"orders/0": 0}
	mu.Unlock()
	waitUntil("orders/1 removed and orders/0 caught up", func() bool { return lag("orders/0") == 0 && lag("orders/1") == -1 })
	cancel()
	<-done
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]effprom.Options{
		"namespace":          {Namespace: "9lives"},
		"namespace dash":     {Namespace: "my-app"},
		"label name":         {ConstLabels: map[string]string{"bad-name": "x"}},
		"reserved label":     {ConstLabels: map[string]string{"__x": "x"}},
		"own label":          {ConstLabels: map[string]string{"consumer": "x"}},
		"empty buckets":      {DurationBuckets: []float64{}},
		"decreasing buckets": {BatchSizeBuckets: []float64{1, 10, 5}},
		"equal buckets":      {MessageAgeBuckets: []float64{1, 1}},
	} {
		_, err := effprom.New(o)
		if !errors.Is(err, effprom.ErrInvalidOptions) {
			t.Errorf("%s: New returned %v, want ErrInvalidOptions", name, err)
		}
		var oe *effprom.OptionsError
		if !errors.As(err, &oe) || oe.Field == "" {
			t.Errorf("%s: %v is not an *OptionsError naming the field", name, err)
		}
	}
	if _, err := effprom.New(effprom.Options{Namespace: "ok_1", ConstLabels: map[string]string{"service": "x"}, BatchSizeBuckets: []float64{1, 10}}); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
}

// TestSeriesStartAtZero checks that a consumer's outcome and result series
// exist, at zero, from its first batch, so that rates are 0 and not absent.
func TestSeriesStartAtZero(t *testing.T) {
	t.Parallel()
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	m.BatchDone(context.Background(), &consumer.BatchStats{BatchInfo: consumer.BatchInfo{Consumer: "c", Strategy: "idset", Batch: 1, Size: 3}, Applied: 3, Total: time.Millisecond})
	s := gather(t, reg)
	if n := len(s["effectively_messages_total"].GetMetric()); n != 7 {
		t.Errorf("%d outcome series, want 7", n)
	}
	if got := s.value(t, "effectively_messages_total", "consumer=c", "outcome=parked"); got != 0 {
		t.Errorf("parked = %v, want 0", got)
	}
	if got := s.value(t, "effectively_batches_total", "consumer=c", "result=ok"); got != 1 {
		t.Errorf("ok batches = %v, want 1", got)
	}
}

// A batch whose COMMIT lost its connection counts its messages and itself
// as unknown, not as applied or failed.
func TestUnknownCommitCounted(t *testing.T) {
	t.Parallel()
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	m.BatchDone(context.Background(), &consumer.BatchStats{BatchInfo: consumer.BatchInfo{Consumer: "c", Strategy: "idset", Batch: 1, Size: 3}, Unknown: 3,
		Err: errors.New("commit outcome unknown: connection reset"), Total: time.Millisecond})
	s := gather(t, reg)
	if got := s.value(t, "effectively_messages_total", "consumer=c", "outcome=unknown"); got != 3 {
		t.Errorf("unknown messages = %v, want 3", got)
	}
	if got := s.value(t, "effectively_messages_total", "consumer=c", "outcome=applied"); got != 0 {
		t.Errorf("applied messages = %v, want 0", got)
	}
	if got := s.value(t, "effectively_batches_total", "consumer=c", "result=unknown"); got != 1 {
		t.Errorf("unknown batches = %v, want 1", got)
	}
	if got := s.value(t, "effectively_batches_total", "consumer=c", "result=error"); got != 0 {
		t.Errorf("error batches = %v, want 0", got)
	}
}

// TestReruns: a batch's re-executions are added to handler_reruns_total,
// whose series exists at zero from the consumer's first batch.
func TestReruns(t *testing.T) {
	t.Parallel()
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx := context.Background()
	batch := func(n uint64, reruns int) *consumer.BatchStats {
		return &consumer.BatchStats{BatchInfo: consumer.BatchInfo{Consumer: "c", Strategy: "idset", Lane: "l", Batch: n, Size: 4},
			Applied: 3, Retried: 1, Isolated: reruns > 0, Reruns: reruns, Total: time.Millisecond}
	}
	m.BatchDone(ctx, batch(1, 0))
	if got := gather(t, reg).value(t, "effectively_handler_reruns_total", "consumer=c"); got != 0 {
		t.Errorf("handler_reruns_total = %v after a batch without re-runs, want 0", got)
	}
	m.BatchDone(ctx, batch(2, 3))
	m.BatchDone(ctx, batch(3, 2))
	if got := gather(t, reg).value(t, "effectively_handler_reruns_total", "consumer=c"); got != 5 {
		t.Errorf("handler_reruns_total = %v, want 5", got)
	}
}

// TestStandbyUnconfirmed: a batch acknowledged without its standbys'
// confirmation (consumer.Config.StandbyAck) is counted, from zero.
func TestStandbyUnconfirmed(t *testing.T) {
	t.Parallel()
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx := context.Background()
	batch := func(n uint64, unconfirmed bool) *consumer.BatchStats {
		return &consumer.BatchStats{BatchInfo: consumer.BatchInfo{Consumer: "c", Strategy: "idset", Lane: "l", Batch: n, Size: 1},
			Applied: 1, StandbyUnconfirmed: unconfirmed, Total: time.Millisecond}
	}
	m.BatchDone(ctx, batch(1, false))
	const name = "effectively_standby_unconfirmed_batches_total"
	if got := gather(t, reg).value(t, name, "consumer=c"); got != 0 {
		t.Errorf("%s = %v after a confirmed batch, want 0", name, got)
	}
	m.BatchDone(ctx, batch(2, true))
	m.BatchDone(ctx, batch(3, true))
	if got := gather(t, reg).value(t, name, "consumer=c"); got != 2 {
		t.Errorf("%s = %v, want 2", name, got)
	}
}

// TestMessageDoneNamesItsConsumer: MessageDone takes the consumer from the
// event, not from a context BatchStart prepared, and keeps consumers apart.
func TestMessageDoneNamesItsConsumer(t *testing.T) {
	t.Parallel()
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx := context.Background()
	event := func(name string, o consumer.Outcome, err error) consumer.MessageEvent {
		return consumer.MessageEvent{
			BatchInfo: consumer.BatchInfo{Consumer: name, Strategy: "idset", Lane: "l", Batch: 7, Size: 2},
			Message:   &consumer.Message{ID: "m", Time: time.Now().Add(-time.Second)},
			Outcome:   o, Err: err,
		}
	}
	m.MessageDone(ctx, event("a", consumer.OutcomeParked, &consumer.ParkedError{Reason: "permanent", Err: errors.New("poison")}))
	m.MessageDone(ctx, event("b", consumer.OutcomeApplied, nil))
	m.MessageDone(ctx, event("b", consumer.OutcomeApplied, nil))
	s := gather(t, reg)
	if got := s.value(t, "effectively_parked_total", "consumer=a", "reason=permanent"); got != 1 {
		t.Errorf("parked_total{consumer=a} = %v, want 1", got)
	}
	if count, sum := s.histogram(t, "effectively_message_age_seconds", "consumer=b"); count != 2 || sum < 2 {
		t.Errorf("message_age_seconds{consumer=b}: count %d sum %v, want 2 observations of at least 1 s", count, sum)
	}
	if _, ok := s["effectively_parked_total"]; ok && len(s["effectively_parked_total"].GetMetric()) != 1 {
		t.Errorf("%d parked_total series, want only consumer a's", len(s["effectively_parked_total"].GetMetric()))
	}
}
