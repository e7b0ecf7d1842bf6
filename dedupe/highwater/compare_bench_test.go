package highwater_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5/pgxpool"
)

// compareBatch is the messages per transaction in the side-by-side
// benchmarks: 100 producers × 10 consecutive seqs.
const (
	compareBatch     = 1000
	compareProducers = 100
)

var producerNames = func() []string {
	out := make([]string, compareProducers)
	for i := range out {
		out[i] = fmt.Sprintf("producer-%03d", i)
	}
	return out
}()

// compareKeys fills keys with batch i of the stream: every producer's seqs
// 10i+1 … 10i+10, with a fingerprint. For idset, ID names the same message.
func compareKeys(keys []dedupe.Key, i int, withID bool) {
	per := compareBatch / compareProducers
	n := 0
	for _, p := range producerNames {
		for j := range per {
			seq := int64(i*per + j + 1)
			fp := make([]byte, dedupe.FingerprintLen)
			binary.BigEndian.PutUint64(fp, uint64(seq))
			k := dedupe.Key{Scope: "replay", Sender: p, Seq: seq, Fingerprint: fp}
			if withID {
				k = dedupe.Key{Scope: "replay", ID: p + "/" + strconv.FormatInt(seq, 10), Fingerprint: fp}
			}
			keys[n] = k
			n++
		}
	}
}

type compared struct {
	name   string
	withID bool
	make   func(b *testing.B, pool *pgxpool.Pool) dedupe.Strategy
}

var comparedStrategies = []compared{
	{"highwater", false, func(b *testing.B, pool *pgxpool.Pool) dedupe.Strategy {
		return newStrategy(b, pool, highwater.Config{})
	}},
	{"idset", true, func(b *testing.B, pool *pgxpool.Pool) dedupe.Strategy {
		s, err := idset.New(idset.Config{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pg.Migrate(context.Background(), pool, "", s.Migrations()...); err != nil {
			b.Fatal(err)
		}
		return s
	}},
}

// claimBatch claims keys in a transaction of its own and commits it, as the
// consumer does for a batch.
func claimBatch(b *testing.B, pool *pgxpool.Pool, s dedupe.Strategy, keys []dedupe.Key, want dedupe.Verdict) {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	vs, err := s.Claim(ctx, tx, keys)
	if err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
	if c, ok := s.(dedupe.Committer); ok {
		c.Committed(keys, vs)
	}
	if vs[0] != want || vs[len(vs)-1] != want {
		b.Fatalf("verdicts %v…%v, want %v", vs[0], vs[len(vs)-1], want)
	}
}

// BenchmarkCompareFresh claims fresh traffic through highwater and idset,
// side by side: one op is a transaction of 1,000 new messages.
//
//	go test ./dedupe/highwater -run '^$' -bench Compare -benchtime=1000x
func BenchmarkCompareFresh(b *testing.B) {
	for _, c := range comparedStrategies {
		b.Run(c.name, func(b *testing.B) {
			pool, _ := newPool(b)
			s := c.make(b, pool)
			keys := make([]dedupe.Key, compareBatch)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				compareKeys(keys, i, c.withID)
				claimBatch(b, pool, s, keys, dedupe.VerdictNew)
			}
			b.ReportMetric(float64(b.N*compareBatch)/time.Since(start).Seconds(), "msgs/s")
			b.StopTimer()
			reportStorage(b, pool)
		})
	}
}

// BenchmarkCompareReplay replays already-applied messages (a topic replay
// after a bug fix) through highwater and idset, side by side: b.N
// transactions of 1,000 messages are applied untimed, then replayed, timed.
// With -benchtime=1000x that is 1,000,000 messages.
func BenchmarkCompareReplay(b *testing.B) {
	for _, c := range comparedStrategies {
		b.Run(c.name, func(b *testing.B) {
			pool, _ := newPool(b)
			s := c.make(b, pool)
			keys := make([]dedupe.Key, compareBatch)
			for i := 0; i < b.N; i++ {
				compareKeys(keys, i, c.withID)
				claimBatch(b, pool, s, keys, dedupe.VerdictNew)
			}
			if _, err := pool.Exec(context.Background(), `VACUUM ANALYZE`); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				compareKeys(keys, i, c.withID)
				claimBatch(b, pool, s, keys, dedupe.VerdictDuplicate)
			}
			b.ReportMetric(float64(b.N*compareBatch)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// reportStorage reports the bytes the strategy's tables take per message.
// (Per sender, see BenchmarkClaimMillionSenders: with only 100 senders the
// tables' first pages dominate.)
func reportStorage(b *testing.B, pool *pgxpool.Pool) {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		b.Fatal(err)
	}
	var bytes int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'effectively' AND c.relkind = 'r' AND c.relname <> 'schema_migrations'`).Scan(&bytes); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(bytes)/float64(b.N*compareBatch), "bytes/msg")
}
