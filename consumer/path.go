package consumer

import (
	"log/slog"

	"github.com/effectively-once/effectively/dedupe"
)

// path is the one path a message takes from its key to its handler,
// shared by the consumer's batches, Redrive and Classify (the replay dry
// run): the key (keys.go), the strategy's claim and what its verdict means
// (claim.go), and the handler call (handle.go).
type path struct {
	capabilities // of the strategy, and of the source if there is one
	cfg          Config
	log          *slog.Logger
	keys         keyer
}

// newPath resolves the capabilities of cfg.Strategy and of src, which is
// nil for work without a source (Redrive, Classify).
func newPath(cfg Config, log *slog.Logger, src Source) path {
	caps := resolveCapabilities(cfg.Strategy, src)
	return path{capabilities: caps, cfg: cfg, log: log, keys: newKeyer(cfg, caps.checker)}
}

// committed tells the strategy which verdicts committed.
func (p *path) committed(keys []dedupe.Key, verdicts []dedupe.Verdict) {
	if p.committer != nil && len(keys) > 0 {
		p.committer.Committed(keys, verdicts)
	}
}
