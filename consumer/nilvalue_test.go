package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// What pgx gives for NULL and empty bytea, which the parked table relies on
// to keep a nil payload (a Kafka tombstone) apart from an empty one: NULL
// scans into a nil []byte and ” into a non-nil empty one, in both the
// binary and the text format, and a nil []byte (alone or in a bytea[])
// is sent as NULL, an empty one as ”.
func TestPgxNullAndEmptyBytea(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{})
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		var null, empty, arrNull, arrEmpty []byte
		var nullIsNull, emptyIsNull bool
		err := e.pool.QueryRow(ctx, `SELECT NULL::bytea, ''::bytea, $1::bytea IS NULL, $2::bytea IS NULL, ($3::bytea[])[1], ($3::bytea[])[2]`,
			mode, []byte(nil), []byte{}, [][]byte{nil, {}}).Scan(&null, &empty, &nullIsNull, &emptyIsNull, &arrNull, &arrEmpty)
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		if null != nil || empty == nil || len(empty) != 0 {
			t.Errorf("mode %v: NULL scanned as %#v, '' as %#v", mode, null, empty)
		}
		if !nullIsNull || emptyIsNull {
			t.Errorf("mode %v: nil sent as NULL: %v; empty sent as NULL: %v", mode, nullIsNull, emptyIsNull)
		}
		if arrNull != nil || arrEmpty == nil {
			t.Errorf("mode %v: bytea[] elements came back as %#v and %#v", mode, arrNull, arrEmpty)
		}
	}
}

// A nil value and key (a Kafka tombstone) stay nil, and an empty value and
// key stay empty, through the engine's handler, the parked table (NULL
// against ”) and a redrive, byte for byte, for the three handler shapes.
func TestNilAndEmptyValuesSurvive(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"handler", "queue", "batch"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 1, DuplicateRate: 0.3, Seed: 7})
			type shape struct {
				id         string
				key, value []byte
			}
			shapes := []shape{
				{"nil-nil", nil, nil},
				{"empty-empty", []byte{}, []byte{}},
				{"nil-empty", nil, []byte{}},
				{"empty-nil", []byte{}, nil},
				{"bytes", []byte{0}, []byte{0xff, 0}},
			}
			for _, s := range shapes {
				e.broker.Publish(0, consumer.Message{ID: s.id, Key: s.key, Value: s.value})
			}
			var (
				mu    sync.Mutex
				bad   []string
				fixed atomic.Bool
				calls atomic.Int64
			)
			check := func(phase string, m *consumer.Message) {
				for _, s := range shapes {
					if s.id != m.ID {
						continue
					}
					if (m.Value == nil) != (s.value == nil) || !bytes.Equal(m.Value, s.value) ||
						(m.Key == nil) != (s.key == nil) || !bytes.Equal(m.Key, s.key) {
						mu.Lock()
						bad = append(bad, phase+" "+s.id)
						mu.Unlock()
					}
					return
				}
			}
			one := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				calls.Add(1)
				if !fixed.Load() {
					check("handler", m)
					return consumer.Permanent(errors.New("not yet"))
				}
				check("redrive", m)
				return nil
			}
			cfg := consumer.Config{BatchSize: 10}
			switch kind {
			case "batch":
				cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
					for _, m := range msgs {
						if err := one(ctx, tx, m); err != nil {
							return err
						}
					}
					return nil
				}
			case "queue":
				cfg.QueueHandler = func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
					if err := one(ctx, nil, m); err != nil {
						return err
					}
					q.Queue(`INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, coalesce($3::bytea, ''))`, m.ID, m.Lane, m.Value)
					return nil
				}
			default:
				cfg.Handler = one
			}
			e.runUntilIdle(e.consumer(cfg), 30*time.Second)

			rows, err := e.pool.Query(context.Background(),
				`SELECT dedupe_id, msg_key IS NULL, msg_key, payload IS NULL, payload FROM effectively.parked ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				var id string
				var keyNull, valueNull bool
				var key, value []byte
				if err := rows.Scan(&id, &keyNull, &key, &valueNull, &value); err != nil {
					t.Fatal(err)
				}
				s := shapes[n]
				n++
				if id != s.id || keyNull != (s.key == nil) || valueNull != (s.value == nil) || !bytes.Equal(key, s.key) || !bytes.Equal(value, s.value) {
					t.Errorf("parked row %s: key NULL %v %x, payload NULL %v %x; want %s", id, keyNull, key, valueNull, value, s.id)
				}
			}
			if rows.Err() != nil || n != len(shapes) {
				t.Fatalf("%d parked rows, want %d (%v)", n, len(shapes), rows.Err())
			}

			fixed.Store(true)
			rcfg := e.redriveConfig(nil)
			rcfg.Handler, rcfg.QueueHandler, rcfg.BatchHandler = cfg.Handler, cfg.QueueHandler, cfg.BatchHandler
			res, err := rcfg.run(e)
			if err != nil || res.Applied != len(shapes) {
				t.Fatalf("redrive: %+v, %v", res, err)
			}
			if len(bad) > 0 {
				t.Fatalf("nil and empty mixed up: %v", bad)
			}
			if kind == "queue" {
				// The redrive sent the statements the handler queued.
				if got := e.effectCounts(); len(got) != len(shapes) {
					t.Errorf("effects after the redrive: %v, want one for each of %d messages", got, len(shapes))
				}
			}
		})
	}
}

// Redrive of a key-less tombstone: a KeyFunc sees the nil value too.
func TestRedriveKeylessTombstone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, consumer.Message{Key: []byte("acct-1"), Value: nil})
	e.broker.Publish(0, consumer.Message{Key: []byte("acct-2"), Value: []byte{}})
	e.runUntilIdle(e.consumer(consumer.Config{}), 30*time.Second)
	cfg := e.redriveConfig(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error { return nil })
	var nils []bool
	cfg.KeyFunc = func(m *consumer.Message) (dedupe.Key, error) {
		nils = append(nils, m.Value == nil)
		return dedupe.Key{ID: string(m.Key)}, nil
	}
	res, err := cfg.run(e)
	if err != nil || res.Applied != 2 {
		t.Fatalf("redrive: %+v, %v", res, err)
	}
	if len(nils) != 2 || !nils[0] || nils[1] {
		t.Fatalf("KeyFunc saw nil values %v, want [true false]", nils)
	}
}
