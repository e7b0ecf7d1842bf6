package kafka

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadRange sees a partition as the Source delivers it: committed and
// plain records, no record of an aborted transaction, no control record,
// and nil apart from empty.
func TestReadRange(t *testing.T) {
	e := newEnv(t, 2)
	log := newTxnLog(e, 2)
	for r := range 4 {
		log.round(r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A tombstone and an empty value after the transactions, on partition 0.
	if err := log.plain.ProduceSync(ctx,
		&kgo.Record{Partition: 0, Value: nil, Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte("null")}}},
		&kgo.Record{Partition: 0, Value: []byte{}, Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte("empty")}}},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := append(append([]string{"null", "empty"}, log.committed...), log.plains...)
	slices.Sort(want)

	cfg := Config{Brokers: e.kafka.Brokers()}
	var got []string
	ends := e.endOffsets()
	for part := range e.partitions {
		last := int64(-1)
		err := ReadRange(ctx, cfg, e.topic, part, 0, ends[part], 3, func(batch []*consumer.Message) error {
			if len(batch) > 3 {
				t.Errorf("a batch of %d, want at most 3", len(batch))
			}
			for _, m := range batch {
				got = append(got, m.ID)
				prefix := laneName(e.topic, part) + "@"
				off, err := strconv.ParseInt(strings.TrimPrefix(m.Ref, prefix), 10, 64)
				if !strings.HasPrefix(m.Ref, prefix) || err != nil || off <= last {
					t.Errorf("%s: Ref %q after offset %d, want %s<offset> in offset order", m.ID, m.Ref, last, prefix)
				}
				last = off
				switch m.ID {
				case "null":
					if m.Value != nil {
						t.Errorf("the tombstone's value is %#v, want nil", m.Value)
					}
				case "empty":
					if m.Value == nil || len(m.Value) != 0 {
						t.Errorf("the empty value is %#v, want []byte{}", m.Value)
					}
				}
				if m.Attempt != 1 || m.Lane != laneName(e.topic, part) || m.Source != SourceName {
					t.Errorf("%s: Attempt %d, Lane %q, Source %q", m.ID, m.Attempt, m.Lane, m.Source)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("partition %d: %v", part, err)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("read %d records, want %d (%d committed, %d plain, 2 more; %d aborted left out)\ngot  %v\nwant %v",
			len(got), len(want), len(log.committed), len(log.plains), len(log.aborted), got, want)
	}

	// fn's error stops the read and is returned.
	stop := errors.New("enough")
	calls := 0
	err := ReadRange(ctx, cfg, e.topic, 0, 0, ends[0], 1, func([]*consumer.Message) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("fn's error: got %v after %d calls, want %v after 1", err, calls, stop)
	}
	// A range past the partition's end says so.
	short, cancelShort := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelShort()
	if err := ReadRange(short, cfg, e.topic, 0, 0, ends[0]+10, 100, func([]*consumer.Message) error { return nil }); err == nil {
		t.Errorf("a range past the end of the partition: no error")
	}
}
