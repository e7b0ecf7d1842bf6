package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// rawRecord is one fetched record as the hand-written consumer keeps it.
type rawRecord struct {
	value []byte
	msg   consumer.Message // its headers, for the commit clock
}

// rawConsume is the hand-written consumer the engine's latency is
// measured against (ShapeRaw): for each partition of topic, one goroutine
// fetches ahead with kafka-go's Client.Fetch (the API the source uses) and
// another writes what has arrived, up to LatencyBatch records a
// transaction, as Raw writes them: the markers of a processed-ID table and
// the ledger rows, each by one unnest statement, then COMMIT. It claims
// nothing, stores no offsets and runs no hooks: a floor under any consumer
// that keeps the promise, on the same fetches, the same database and the
// same machine. Each committed batch is reported to clock as the engine's
// hooks report theirs. ready is closed once every partition was fetched
// from, or its fetcher gave up (as the engine's run waits for its
// partitions to be assigned). It returns when ctx is done.
func rawConsume(ctx context.Context, pool *pgxpool.Pool, brokers []string, topic string, clock *commitClock, ready chan<- struct{}) error {
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: kafkatest.MaxWait + 10*time.Second}
	var batchSeq atomic.Uint64
	var fetching sync.WaitGroup
	fetching.Add(LatencyPartitions)
	go func() { fetching.Wait(); close(ready) }()
	errc := make(chan error, 2*LatencyPartitions)
	var wg sync.WaitGroup
	for p := range LatencyPartitions {
		fetched := make(chan []rawRecord, 64)
		lane := topic + "/" + strconv.Itoa(p)
		wg.Add(2)
		var once sync.Once
		first := func() { once.Do(fetching.Done) }
		go func() {
			defer wg.Done()
			defer close(fetched)
			defer first() // a fetcher that gave up does not hold ready up
			if err := rawFetch(ctx, cl, topic, p, fetched, first); err != nil && ctx.Err() == nil {
				errc <- err
			}
		}()
		go func() {
			defer wg.Done()
			if err := rawWrite(ctx, pool, lane, fetched, clock, &batchSeq); err != nil && ctx.Err() == nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// rawFetch fetches partition p of topic from offset 0 onwards and sends
// each response's records to out, until ctx is done; it calls fetched
// after each fetch that succeeded.
func rawFetch(ctx context.Context, cl *kafkago.Client, topic string, p int, out chan<- []rawRecord, fetched func()) error {
	var offset int64
	var failingSince time.Time // of the current run of failed fetches
	for ctx.Err() == nil {
		res, err := cl.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Partition: p, Offset: offset,
			MinBytes: 1, MaxBytes: 1 << 20, MaxWait: kafkatest.MaxWait})
		if err == nil {
			err = res.Error
		}
		if err != nil {
			// Retried, as any consumer does: a topic just created is
			// not known to every broker's metadata at once.
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) > 30*time.Second {
				return fmt.Errorf("bench: raw fetch %s/%d at %d, failing for 30s: %w", topic, p, offset, err)
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		failingSince = time.Time{}
		fetched()
		var recs []rawRecord
		for res.Records != nil {
			r, err := res.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("bench: raw fetch %s/%d: %w", topic, p, err)
			}
			if r.Offset < offset {
				continue
			}
			offset = r.Offset + 1
			v, err := kafkago.ReadAll(r.Value)
			if err != nil {
				return err
			}
			rec := rawRecord{value: v}
			for _, h := range r.Headers {
				rec.msg.Headers = append(rec.msg.Headers, consumer.Header{Key: h.Key, Value: h.Value})
			}
			recs = append(recs, rec)
		}
		if len(recs) == 0 {
			continue
		}
		select {
		case out <- recs:
		case <-ctx.Done():
		}
	}
	return nil
}

// rawWrite commits what in delivers, everything that has arrived up to
// LatencyBatch records a transaction, and reports each batch to clock.
func rawWrite(ctx context.Context, pool *pgxpool.Pool, lane string, in <-chan []rawRecord, clock *commitClock, seq *atomic.Uint64) error {
	var pending []rawRecord
	for {
		if len(pending) == 0 {
			recs, ok := <-in
			if !ok {
				return nil
			}
			pending = recs
		}
	more:
		for len(pending) < LatencyBatch {
			select {
			case recs, ok := <-in:
				if !ok {
					break more
				}
				pending = append(pending, recs...)
			default:
				break more
			}
		}
		n := min(len(pending), LatencyBatch)
		batch := pending[:n]
		info := consumer.BatchInfo{Lane: lane, Batch: seq.Add(1), Size: n}
		clock.BatchStart(ctx, info)
		start := time.Now()
		scopes := make([]string, n)
		ids := make([]string, n)
		fps := make([][]byte, n)
		accounts := make([]string, n)
		amounts := make([]int64, n)
		for i, r := range batch {
			var t transfer
			if err := json.Unmarshal(r.value, &t); err != nil {
				return fmt.Errorf("bench: raw: %w", err)
			}
			scopes[i], ids[i], fps[i], accounts[i], amounts[i] = "bench", t.ID, dedupe.Fingerprint(r.value), t.Account, t.Amount
		}
		var handled time.Time
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			err := rawRows(ctx, tx, scopes, ids, fps, accounts, amounts)
			handled = time.Now()
			return err
		})
		if err != nil {
			return fmt.Errorf("bench: raw: %w", err)
		}
		clock.BatchDone(ctx, &consumer.BatchStats{BatchInfo: info, Applied: n,
			Handle: handled.Sub(start), Commit: time.Since(handled)})
		for i := range batch {
			clock.MessageDone(ctx, consumer.MessageEvent{BatchInfo: info, Message: &batch[i].msg, Outcome: consumer.OutcomeApplied})
		}
		pending = pending[n:]
	}
}
