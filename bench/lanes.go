package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Shape is one of the consumer's handler shapes.
type Shape int

// The handler shapes, as Engine and EngineQueue configure them.
const (
	ShapeHandler Shape = iota // a per-message Handler, one Exec per message
	ShapeQueue                // a per-message QueueHandler, one round trip per batch
	ShapeBatch                // a BatchHandler, one unnest statement per batch
	// ShapeRaw is no engine: the latency benchmark's hand-written consumer
	// (see KafkaLatency), not one of Shapes.
	ShapeRaw
)

// Shapes lists the handler shapes in table order.
var Shapes = []Shape{ShapeHandler, ShapeQueue, ShapeBatch}

func (s Shape) String() string {
	switch s {
	case ShapeHandler:
		return "Handler"
	case ShapeQueue:
		return "QueueHandler"
	case ShapeBatch:
		return "BatchHandler"
	case ShapeRaw:
		return "hand-written"
	}
	return fmt.Sprintf("Shape(%d)", int(s))
}

func (s Shape) configure(cfg *consumer.Config) {
	switch s {
	case ShapeHandler:
		setHandler(cfg, false)
	case ShapeQueue:
		cfg.QueueHandler = queueTransfer
	case ShapeBatch:
		setHandler(cfg, true)
	}
}

// PrepareEngine publishes n messages round-robin over lanes lanes of a test
// broker and returns a consumer of handler shape s that runs up to lanes
// batches at once (Config.Concurrency), ready to Run. pool should allow at
// least lanes connections.
func PrepareEngine(pool *pgxpool.Pool, n, batch, lanes int, s Shape) (*Prepared, error) {
	if lanes < 1 {
		return nil, fmt.Errorf("bench: lanes must be at least 1, got %d", lanes)
	}
	return prepare(pool, n, batch, lanes, s.configure)
}

// RawLanes is Raw at a concurrency of lanes: lanes goroutines each write
// their share of the n messages' rows as Raw does, each with its own
// transactions. pool should allow at least lanes connections.
func RawLanes(ctx context.Context, pool *pgxpool.Pool, n, batch, lanes int) (time.Duration, error) {
	if lanes < 1 {
		return 0, fmt.Errorf("bench: lanes must be at least 1, got %d", lanes)
	}
	start := time.Now()
	errs := make([]error, lanes)
	var wg sync.WaitGroup
	for k := range lanes {
		wg.Go(func() { errs[k] = raw(ctx, pool, k*n/lanes, (k+1)*n/lanes, batch) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		return 0, err
	}
	if rows != n {
		return 0, fmt.Errorf("ledger has %d rows after %d messages", rows, n)
	}
	return elapsed, nil
}
