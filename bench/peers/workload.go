package peers

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Workload is the input of one run.
type Workload struct {
	// Messages is N, the number of logical messages.
	Messages int
	// DupEvery: every DupEvery-th message is produced twice; 0 means never.
	DupEvery int
	// DupLag is how many records after the original the copy is produced.
	DupLag int
}

// Records returns how many records the workload produces.
func (w Workload) Records() int {
	if w.DupEvery <= 0 {
		return w.Messages
	}
	return w.Messages + (w.Messages+w.DupEvery-1)/w.DupEvery
}

// transfer is the payload of a message.
type transfer struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// logical returns logical message i: its id and its payload, a short JSON
// object like the ones the library's own benchmarks use.
func logical(i int) (id string, payload []byte) {
	id = fmt.Sprintf("transfer-%08d", i)
	payload = fmt.Appendf(nil, `{"id":%q,"account":"acct-%03d","amount":%d}`, id, i%500, i%1000+1)
	return id, payload
}

// parse decodes a payload.
func parse(payload []byte) (transfer, error) {
	var t transfer
	if err := json.Unmarshal(payload, &t); err != nil {
		return t, fmt.Errorf("bad payload %q: %w", payload, err)
	}
	if t.ID == "" {
		return t, fmt.Errorf("payload %q has no id", payload)
	}
	return t, nil
}

// order returns the sequence of logical messages to produce: every message
// once, and every DupEvery-th again, DupLag messages after it (copies due
// after the last message come at the end).
func (w Workload) order() []int {
	type rec struct {
		at float64
		i  int
	}
	recs := make([]rec, 0, w.Records())
	for i := range w.Messages {
		recs = append(recs, rec{float64(i), i})
		if w.DupEvery > 0 && i%w.DupEvery == 0 {
			recs = append(recs, rec{float64(i+w.DupLag) + 0.5, i})
		}
	}
	slices.SortStableFunc(recs, func(a, b rec) int { return cmp.Compare(a.at, b.at) })
	out := make([]int, len(recs))
	for k, r := range recs {
		out[k] = r.i
	}
	return out
}

// Produce writes the workload to topic with kgo, keyed by the message id
// (so both copies of a message go to the same partition), and returns the
// end offset of every partition it wrote to.
func (w Workload) Produce(ctx context.Context, brokers []string, topic string) (map[int32]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation())
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends := map[int32]int64{}
	const chunk = 5000
	order := w.order()
	for lo := 0; lo < len(order); lo += chunk {
		recs := make([]*kgo.Record, 0, chunk)
		for _, i := range order[lo:min(lo+chunk, len(order))] {
			id, payload := logical(i)
			recs = append(recs, &kgo.Record{Key: []byte(id), Value: payload,
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultIDHeader, Value: []byte(id)}}})
		}
		res := cl.ProduceSync(ctx, recs...)
		if err := res.FirstErr(); err != nil {
			return nil, fmt.Errorf("produce to %s: %w", topic, err)
		}
		for _, r := range res {
			ends[r.Record.Partition] = max(ends[r.Record.Partition], r.Record.Offset+1)
		}
	}
	return ends, nil
}

// Setup creates the ledger, the hand-written consumer's processed-ids table
// and this library's tables in pool's database.
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	s, err := idset.New(idset.Config{})
	if err != nil {
		return err
	}
	lines := append(s.Migrations(), parked.Line("", ""), kafka.OffsetsLine("", ""))
	if _, err := pg.Migrate(ctx, pool, "", lines...); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `
CREATE TABLE IF NOT EXISTS ledger (
    msg_id  text   NOT NULL,
    account text   NOT NULL,
    amount  bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_msg_id ON ledger (msg_id);
CREATE TABLE IF NOT EXISTS processed_ids (msg_id text PRIMARY KEY);`)
	return err
}

// Reset empties every table before a run.
func Reset(ctx context.Context, pool *pgxpool.Pool) error {
	for _, q := range []string{
		`TRUNCATE ledger, processed_ids, effectively.processed, effectively.parked, effectively.kafka_offsets`,
		`VACUUM ANALYZE ledger`,
		`VACUUM ANALYZE processed_ids`,
		`VACUUM ANALYZE effectively.processed`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// Effects is what a run left in the ledger, counted against its N logical
// messages.
type Effects struct {
	// Double counts the ledger rows beyond one per logical message.
	Double int
	// Lost counts the logical messages with no ledger row.
	Lost int
}

// Count reads the ledger after a run of w.
func Count(ctx context.Context, pool *pgxpool.Pool, w Workload) (Effects, error) {
	var rows, distinct, strangers int
	err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id),
       count(*) FILTER (WHERE CASE WHEN msg_id ~ '^transfer-[0-9]{8}$' THEN substr(msg_id, 10)::int >= $1 ELSE true END)
FROM ledger`, w.Messages).Scan(&rows, &distinct, &strangers)
	if err != nil {
		return Effects{}, err
	}
	if strangers > 0 {
		return Effects{}, fmt.Errorf("ledger has %d rows for messages never produced", strangers)
	}
	return Effects{Double: rows - distinct, Lost: w.Messages - distinct}, nil
}
