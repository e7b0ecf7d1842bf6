package kafka

import (
	"context"
	"errors"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// OffsetStore is the offsets table as a consuming source writes it: the
// claim of partitions when a generation is assigned them, and the write of
// a partition's next offset in the batch's transaction, both fenced by the
// generation (see "Offsets in Postgres" in the package documentation).
// Source uses it, and so do the Kafka sources of this repository built on
// other clients (sources/franz), so that every Kafka source keeps its
// positions in one table under one set of rules, and the operations tools
// (Offsets, the CLI's offsets and replay commands) work for all of them.
// Applications use Source, or Offsets for tooling.
type OffsetStore struct{ st *offsetStore }

// NewOffsetStore returns the offsets table schema.table for group; schema
// defaults to "effectively" and table to "kafka_offsets", as in Config.
func NewOffsetStore(db dedupe.DB, group, schema, table string) *OffsetStore {
	schema, table = offsetsName(schema, table)
	return &OffsetStore{st: newOffsetStore(db, group, schema, table)}
}

// Line returns the table's migration line.
func (s *OffsetStore) Line() dedupe.Line { return s.st.line() }

// ErrClaimBusy is returned by OffsetStore.Claim when it waited too long for
// a row lock (another claim inserting the same rows): every partition of
// the call is to be claimed again.
var ErrClaimBusy = errClaimBusy

// Claim raises the generation of the partitions' rows to gen, in a
// transaction of its own, and returns their stored next offsets (-1 where
// none is stored), except for the rows another transaction holds locked (a
// batch of an earlier owner between its offset write and its commit):
// those are returned in busy, to be claimed again once that transaction
// ended. Partitions whose row belongs to a newer generation are in
// neither: the caller must not consume them in generation gen.
func (s *OffsetStore) Claim(ctx context.Context, gen int32, tps []TopicPartition) (claimed map[TopicPartition]int64, busy []TopicPartition, err error) {
	in := make([]topicPartition, len(tps))
	for i, tp := range tps {
		in[i] = topicPartition{tp.Topic, tp.Partition}
	}
	got, b, err := s.st.claim(ctx, gen, in)
	if err != nil {
		return nil, nil, err
	}
	claimed = make(map[TopicPartition]int64, len(got))
	for tp, next := range got {
		claimed[TopicPartition{tp.topic, tp.partition}] = next
	}
	return claimed, exported(b), nil
}

// Write stores next as tp's next offset in tx, over known, the offset the
// writer knows the table holds (-1 for none). It fails with an error
// wrapping consumer.ErrFenced when a newer generation owns the row, or
// when the row holds less than known or is gone: the table went back
// behind the writer's back (a database failover that lost commits, a
// replay), which WentBack tells apart.
func (s *OffsetStore) Write(ctx context.Context, tx pgx.Tx, tp TopicPartition, gen int32, next, known int64) error {
	return s.st.write(ctx, tx, topicPartition{tp.Topic, tp.Partition}, gen, next, known)
}

// WentBack reports whether err, from OffsetStore.Write, says that the
// table went back: it holds found (-1 for nothing) where the writer knew
// it held known. The partition is then to be consumed again from the
// offset a new claim returns.
func WentBack(err error) (known, found int64, ok bool) {
	var back *wentBackError
	if !errors.As(err, &back) {
		return 0, 0, false
	}
	return back.known, back.found, true
}

// OriginMetadata is the metadata a source commits to Kafka with a
// partition's offset when its offsets live in Postgres: the partition's
// origin, the offset from which the group first consumed it with its
// offsets in Postgres (see "Offsets in Postgres"); "" for a negative
// origin.
func OriginMetadata(origin int64) string { return originMetadata(origin) }

// ParseOrigin returns the origin that the metadata of an offset committed
// to Kafka carries (see OriginMetadata), or -1 when it carries none.
func ParseOrigin(metadata string) int64 { return parseOrigin(metadata) }

// AuthFailure wraps err so that it matches ErrAuthentication (and is
// permanent to the consumer once wrapped with consumer.Permanent) when it
// says that the brokers refused the connection's SASL credentials or the
// TLS handshake failed on a certificate; other errors are returned as they
// are. The Kafka sources of this repository built on other clients use it
// for the TLS failures, which do not depend on the client.
func AuthFailure(err error) error { return authFailure(err) }
