package highwater_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
)

const benchBatch = 500

// BenchmarkClaim claims fresh seqs, a batch of 500 keys (100 senders × 5
// consecutive seqs) per committed transaction.
//
//	go test ./dedupe/highwater -run '^$' -bench 'Claim$'
func BenchmarkClaim(b *testing.B) {
	for _, mode := range []highwater.Mode{highwater.Strict, highwater.Monotonic} {
		b.Run(mode.String(), func(b *testing.B) {
			pool, _ := newPool(b)
			s := newStrategy(b, pool, highwater.Config{Mode: mode})
			const senders, perSender = 100, benchBatch / 100
			names := make([]string, senders)
			for i := range names {
				names[i] = fmt.Sprintf("producer-%03d", i)
			}
			next := int64(1)
			batch := make([]dedupe.Key, 0, benchBatch)
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				batch = batch[:0]
				for _, n := range names {
					for j := range int64(perSender) {
						batch = append(batch, dedupe.Key{Scope: "bench", Sender: n, Seq: next + j})
					}
				}
				next += perSender
				vs := claimTx(b, pool, s, batch, nil)
				if vs[len(vs)-1] != dedupe.VerdictNew {
					b.Fatalf("verdict %v", vs[len(vs)-1])
				}
			}
			b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "keys/s")
		})
	}
}

// BenchmarkClaimCachedDuplicates claims batches of 500 already-applied keys
// (a replay): the cache answers all of them, with no statement.
//
//	go test ./dedupe/highwater -run '^$' -bench CachedDuplicates
func BenchmarkClaimCachedDuplicates(b *testing.B) {
	pool, counter := newPool(b)
	s := newStrategy(b, pool, highwater.Config{})
	batch := make([]dedupe.Key, 0, benchBatch)
	for i := range 100 {
		for seq := int64(1); seq <= benchBatch/100; seq++ {
			batch = append(batch, dedupe.Key{Scope: "bench", Sender: fmt.Sprintf("producer-%03d", i), Seq: seq})
		}
	}
	claimTx(b, pool, s, batch, nil)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(ctx)
	counter.reset()
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		vs, err := s.Claim(ctx, tx, batch)
		if err != nil {
			b.Fatal(err)
		}
		if vs[0] != dedupe.VerdictDuplicate {
			b.Fatalf("verdict %v", vs[0])
		}
	}
	b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "keys/s")
	if n := counter.statements.Load(); n != 0 {
		b.Fatalf("%d statements for cached duplicates", n)
	}
}

// BenchmarkClaimMillionSenders claims seq 1 of 1,000 new senders per
// committed transaction; with -benchtime=1000x it creates a million senders
// through the default cache (100,000 entries), and reports the evictions
// and the marks table's size per sender.
//
//	go test ./dedupe/highwater -run '^$' -bench MillionSenders -benchtime=1000x
func BenchmarkClaimMillionSenders(b *testing.B) {
	pool, _ := newPool(b)
	s := newStrategy(b, pool, highwater.Config{})
	const perBatch = 1000
	batch := make([]dedupe.Key, perBatch)
	next := 0
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		for i := range batch {
			batch[i] = dedupe.Key{Scope: "bench", Sender: fmt.Sprintf("device-%07d", next), Seq: 1}
			next++
		}
		claimTx(b, pool, s, batch, nil)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(next)/elapsed.Seconds(), "senders/s")
	st := s.Stats()
	b.ReportMetric(float64(st.CacheEvictions), "evictions")
	b.ReportMetric(float64(st.CacheEntries), "cached")
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE effectively.marks`); err != nil {
		b.Fatal(err)
	}
	var bytes, rows int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size('effectively.marks'), count(*) FROM effectively.marks`).Scan(&bytes, &rows); err != nil {
		b.Fatal(err)
	}
	if rows != int64(next) {
		b.Fatalf("%d marks for %d senders", rows, next)
	}
	b.ReportMetric(float64(bytes)/float64(rows), "bytes/sender")
}
