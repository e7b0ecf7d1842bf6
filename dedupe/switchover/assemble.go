package switchover

import (
	"time"

	"github.com/effectively-once/effectively/dedupe"
)

// core is what both wrappers implement whatever their parts are: the
// optional interfaces whose absence in a part can be answered by doing
// nothing (no check to forward, nothing to maintain, no memory to tell).
// KeyChecker and Retainer are different: a wrapper that claimed them
// without a part behind them would tell the consumer something false (every
// key is storable; markers expire after zero), so assemble adds them only
// when a part has them, as consumer.New finds capabilities by type
// assertion.
type core interface {
	dedupe.Strategy
	dedupe.Sequencer
	dedupe.Committer
	dedupe.Migrator
	dedupe.Maintainer
	dedupe.Warmer
	dedupe.Inspector
}

// checking adds dedupe.KeyChecker to a core.
type checking struct {
	core
	check func(dedupe.Key) error
}

// retaining adds dedupe.Retainer to a core.
type retaining struct {
	core
	r dedupe.Retainer
}

// checkingRetaining adds both.
type checkingRetaining struct {
	core
	check func(dedupe.Key) error
	r     dedupe.Retainer
}

var (
	_ dedupe.KeyChecker = checking{}
	_ dedupe.Retainer   = retaining{}
	_ dedupe.KeyChecker = checkingRetaining{}
	_ dedupe.Retainer   = checkingRetaining{}
)

func (c checking) CheckKey(k dedupe.Key) error          { return c.check(k) }
func (c retaining) Retention() time.Duration            { return c.r.Retention() }
func (c checkingRetaining) CheckKey(k dedupe.Key) error { return c.check(k) }
func (c checkingRetaining) Retention() time.Duration    { return c.r.Retention() }

// assemble returns c with CheckKey when check is not nil and Retention when
// r is not nil.
func assemble(c core, check func(dedupe.Key) error, r dedupe.Retainer) dedupe.Strategy {
	switch {
	case check != nil && r != nil:
		return checkingRetaining{c, check, r}
	case check != nil:
		return checking{c, check}
	case r != nil:
		return retaining{c, r}
	}
	return c
}

// checkers returns a CheckKey that asks every part that is a
// dedupe.KeyChecker, in order, or nil when none is.
func checkers(parts ...dedupe.Strategy) func(dedupe.Key) error {
	var kcs []dedupe.KeyChecker
	for _, p := range parts {
		if kc, ok := p.(dedupe.KeyChecker); ok {
			kcs = append(kcs, kc)
		}
	}
	if len(kcs) == 0 {
		return nil
	}
	return func(k dedupe.Key) error {
		for _, kc := range kcs {
			if err := kc.CheckKey(k); err != nil {
				return err
			}
		}
		return nil
	}
}
