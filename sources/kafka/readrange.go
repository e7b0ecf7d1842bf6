package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// readRangeStall is how long ReadRange goes on retrying fetches that fail
// without a record read in between, before it returns the last error.
const readRangeStall = 30 * time.Second

// ReadRange reads the records of one partition at offsets from to to-1
// exactly as a Source of cfg delivers them: the same isolation (records of
// aborted transactions left out unless cfg.ReadUncommitted, control records
// always), the same connection settings, and Messages with the same ID,
// Ref, Lane, Key, Value (nil and empty apart) and Headers, with Attempt 1.
// It calls fn with the messages in offset order, at most max at a time,
// and stops at the first error fn returns. It consumes nothing: no group
// is joined and no offset is stored. It is for tools that look at a range
// of a topic, such as a replay's dry run.
//
// cfg needs Brokers; Group and Topics are not used. Fetch failures are
// retried while some record keeps coming; ReadRange returns the error
// after 30 seconds without one.
func ReadRange(ctx context.Context, cfg Config, topic string, partition int, from, to int64, max int, fn func([]*consumer.Message) error) error {
	if len(cfg.Brokers) == 0 {
		return &ConfigError{Package: "kafka", Field: "Brokers", Reason: "at least one broker address is required"}
	}
	if from < 0 || to < from {
		return fmt.Errorf("kafka: read range: offsets [%d, %d) are not a range", from, to)
	}
	if max < 1 {
		max = 1
	}
	cfg = cfg.withDefaults()
	tp := topicPartition{topic, partition}
	f := newFetcher(cfg, cfg.Logger, tp, from)
	defer f.close()
	lane := laneName(topic, partition)
	batch := make([]*consumer.Message, 0, max)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := fn(batch)
		batch = make([]*consumer.Message, 0, max)
		return err
	}
	var lastErr error
	progress := time.Now()
	for f.offset < to {
		before := f.offset
		res, err := f.fetch(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			lastErr = err
			if time.Since(progress) > readRangeStall {
				return fmt.Errorf("kafka: reading %s at offset %d: %w", lane, f.offset, lastErr)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		for i := range res.records {
			r := &res.records[i]
			if r.offset < from {
				continue
			}
			if r.offset >= to {
				break
			}
			m := &consumer.Message{Attempt: 1}
			recordMessage(m, lane, r, cfg.IDHeader)
			batch = append(batch, m)
			if len(batch) == max {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if len(res.records) > 0 || f.offset > before {
			progress = time.Now()
		} else if hw := f.highWatermark.Load(); hw >= 0 && hw < to && f.offset >= hw {
			return fmt.Errorf("kafka: reading %s: the partition ends at offset %d, before %d", lane, hw, to)
		} else if time.Since(progress) > readRangeStall {
			return errors.Join(fmt.Errorf("kafka: reading %s: no record at offset %d for %s", lane, f.offset, readRangeStall), lastErr)
		}
	}
	return flush()
}
