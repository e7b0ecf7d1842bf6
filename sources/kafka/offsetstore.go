package kafka

import (
	"context"
	"errors"

	"github.com/effectively-once/effectively/pg"
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
func NewOffsetStore(db pg.DB, group, schema, table string) *OffsetStore {
	schema, table = offsetsName(schema, table)
	return &OffsetStore{st: newOffsetStore(db, group, schema, table)}
}

// Line returns the table's migration line.
func (s *OffsetStore) Line() pg.Line { return s.st.line() }

// ErrClaimBusy is returned by OffsetStore.Claim when it waited too long for
// a row lock (another claim inserting the same rows): every partition of
// the call is to be claimed again.
var ErrClaimBusy = errClaimBusy

// StoredPosition is what the offsets table holds of a partition: Next, the
// offset to consume from, and High, the offset after the highest record
// whose batch committed, which moves with every batch even while a
// retried message holds Next back; -1 for none.
type StoredPosition struct{ Next, High int64 }

// NoStoredPosition is a partition without a stored offset.
var NoStoredPosition = StoredPosition{Next: -1, High: -1}

func (p position) exported() StoredPosition { return StoredPosition{Next: p.next, High: p.high} }
func (p StoredPosition) internal() position { return position{next: p.Next, high: p.High} }

// Claim raises the generation of the partitions' rows to gen, in a
// transaction of its own, and returns their stored positions (NoStoredPosition
// where none is stored), except for the rows another transaction holds locked (a
// batch of an earlier owner between its offset write and its commit):
// those are returned in busy, to be claimed again once that transaction
// ended. Partitions whose row belongs to a newer generation are in
// neither: the caller must not consume them in generation gen.
func (s *OffsetStore) Claim(ctx context.Context, gen int32, tps []TopicPartition) (claimed map[TopicPartition]StoredPosition, busy []TopicPartition, err error) {
	in := make([]topicPartition, len(tps))
	for i, tp := range tps {
		in[i] = topicPartition{tp.Topic, tp.Partition}
	}
	got, b, err := s.st.claim(ctx, gen, in)
	if err != nil {
		return nil, nil, err
	}
	claimed = make(map[TopicPartition]StoredPosition, len(got))
	for tp, pos := range got {
		claimed[TopicPartition{tp.topic, tp.partition}] = pos.exported()
	}
	return claimed, exported(b), nil
}

// Write stores to as tp's position in tx (the table keeps the higher of
// what it holds and to, for both offsets), over known, the position the
// writer knows the table holds (NoStoredPosition for none). A batch writes Next,
// its partition's commit point, and High, the offset after the highest
// record it commits (at least Next). Write fails with an error wrapping
// consumer.ErrFenced when a newer generation owns the row, or when the
// row holds less than known (either offset) or is gone: the table went
// back behind the writer's back (a database failover that lost commits, a
// replay), which WentBack tells apart.
func (s *OffsetStore) Write(ctx context.Context, tx pgx.Tx, tp TopicPartition, gen int32, to, known StoredPosition) error {
	return s.st.write(ctx, tx, topicPartition{tp.Topic, tp.Partition}, gen, to.internal(), known.internal())
}

// Positions reads the stored positions of tps; a partition without a row
// is absent. A source compares them with what its lanes know they stored
// (Behind), so that a lane with nothing more to consume, whose next write
// would find it out, still learns that the table went back.
func (s *OffsetStore) Positions(ctx context.Context, tps []TopicPartition) (map[TopicPartition]StoredPosition, error) {
	in := make([]topicPartition, len(tps))
	for i, tp := range tps {
		in[i] = topicPartition{tp.Topic, tp.Partition}
	}
	got, err := s.st.positions(ctx, in)
	if err != nil {
		return nil, err
	}
	out := make(map[TopicPartition]StoredPosition, len(got))
	for tp, pos := range got {
		out[TopicPartition{tp.topic, tp.partition}] = pos.exported()
	}
	return out, nil
}

// Behind reports whether found holds less than known, for either offset:
// the table went back.
func Behind(found, known StoredPosition) bool { return behind(found.internal(), known.internal()) }

// WentBack reports whether err, from OffsetStore.Write, says that the
// table went back: it holds found (NoStoredPosition for nothing) where the
// writer knew it held known. The partition is then to be consumed again
// from the offset a new claim returns.
func WentBack(err error) (known, found StoredPosition, ok bool) {
	var back *wentBackError
	if !errors.As(err, &back) {
		return StoredPosition{}, StoredPosition{}, false
	}
	return back.known.exported(), back.found.exported(), true
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
