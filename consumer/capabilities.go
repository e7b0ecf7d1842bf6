package consumer

import "github.com/effectively-once/effectively/dedupe"

// capabilities are the optional interfaces of a consumer's strategy and
// source, found once, by New, rather than asserted wherever they are used
// (the set is described under "Optional interfaces" in this package's
// documentation and in dedupe's). A nil field is a capability the value
// lacks. Consumer embeds them, so the batch code reads c.checker,
// c.sequenced and so on.
type capabilities struct {
	// Of the strategy.
	checker    dedupe.KeyChecker // keys checked before the claim
	sequenced  bool              // a dedupe.Sequencer that said true
	committer  dedupe.Committer  // told what committed
	retainer   dedupe.Retainer   // retention compared with the source's horizons
	migrator   dedupe.Migrator   // its tables in Migrations
	maintainer dedupe.Maintainer // Maintain in preflight, RunMaintenance in the background
	warmer     dedupe.Warmer     // Warm in the background

	// Of the source.
	txsrc        TxSource        // BeforeCommit in every batch transaction
	pipeline     PipelineSource  // a lane's next batch handed out while its last one commits
	horizon      HorizonSource   // redelivery horizon, compared with the retention
	contentIDs   ContentIDSource // content-derived IDs' window, compared with the retention
	keepRetrying bool            // an ExhaustionSource that leaves exhausted messages to its broker
	srcMigrator  dedupe.Migrator // its tables in Migrations
}

// resolveCapabilities finds the optional interfaces of s and of src; src
// may be nil, for work that has a strategy but no source.
func resolveCapabilities(s dedupe.Strategy, src Source) capabilities {
	var c capabilities
	c.checker, _ = s.(dedupe.KeyChecker)
	if sq, ok := s.(dedupe.Sequencer); ok {
		c.sequenced = sq.Sequenced()
	}
	c.committer, _ = s.(dedupe.Committer)
	c.retainer, _ = s.(dedupe.Retainer)
	c.migrator, _ = s.(dedupe.Migrator)
	c.maintainer, _ = s.(dedupe.Maintainer)
	c.warmer, _ = s.(dedupe.Warmer)
	if src == nil {
		return c
	}
	c.txsrc, _ = src.(TxSource)
	c.pipeline, _ = src.(PipelineSource)
	c.horizon, _ = src.(HorizonSource)
	c.contentIDs, _ = src.(ContentIDSource)
	if es, ok := src.(ExhaustionSource); ok {
		c.keepRetrying = !es.ParkExhausted()
	}
	c.srcMigrator, _ = src.(dedupe.Migrator)
	return c
}
