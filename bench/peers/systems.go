package peers

import (
	"context"
	"math"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
)

// runFunc consumes spec.Topic as spec.Group until ctx is done, reporting to
// p; the worker's ctx is done when p saw Spec.Expect records, or on SIGTERM.
type runFunc func(ctx context.Context, spec Spec, p *progress) error

// System is one consumer measured.
type System struct {
	Name string
	// Library marks this library's shapes: they run Options.Messages in the
	// throughput phase, the others Options.PeerMessages, and ratios are to
	// the fastest of them.
	Library bool
	// Batched marks a peer that applies a batch per transaction: it runs
	// Options.Messages in the throughput phase, as this library's shapes
	// do, so that it runs for a comparable time.
	Batched bool
	run     runFunc
}

// Systems returns every system, in table order.
func Systems() []System {
	var out []System
	for _, s := range Shapes {
		out = append(out, System{Name: "effectively, " + s.Name, Library: true, run: runEffectively(s)})
	}
	for _, s := range Shapes {
		if s.Name == FranzShape {
			out = append(out, System{Name: "effectively on franz-go, " + s.Name, Library: true, run: runFranz(s)})
		}
	}
	return append(out,
		System{Name: "Watermill + Deduplicator, as shipped (Adler-32)", run: runWatermill(nil)},
		System{Name: "Watermill + Deduplicator, SHA-256", run: runWatermill(middleware.NewMessageHasherSHA256(math.MaxInt64))},
		System{Name: "kafka-go + pgx, a transaction per message", run: runKafkaGo(false)},
		System{Name: "kafka-go + pgx, a transaction per message, processed-ids check", run: runKafkaGo(true)},
		System{Name: FranzGoPeer, Batched: true, run: runFranzGo},
	)
}

// FranzGoPeer is the hand-written franz-go + pgx consumer's row.
const FranzGoPeer = "franz-go + pgx, a transaction per batch, processed-ids table"

func lookup(name string) (System, bool) {
	for _, s := range Systems() {
		if s.Name == name {
			return s, true
		}
	}
	return System{}, false
}

// openPool connects to the database at url with room for every lane.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8
	return pgxpool.NewWithConfig(ctx, cfg)
}
