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
	cfg       Config
	log       *slog.Logger
	keys      keyer
	committer dedupe.Committer // told what committed, if the strategy caches
}

func newPath(cfg Config, log *slog.Logger) path {
	p := path{cfg: cfg, log: log, keys: newKeyer(cfg)}
	p.committer, _ = cfg.Strategy.(dedupe.Committer)
	return p
}

// committed tells the strategy which verdicts committed.
func (p *path) committed(keys []dedupe.Key, verdicts []dedupe.Verdict) {
	if p.committer != nil && len(keys) > 0 {
		p.committer.Committed(keys, verdicts)
	}
}
