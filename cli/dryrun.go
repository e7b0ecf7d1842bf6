package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// DryRunCounts classifies the messages of a range. Applied, Parked and New
// partition it together with InvalidKey, Mismatch and Gap; the Replay*
// fields predict what consumers do when the range is replayed.
type DryRunCounts struct {
	Messages int64 `json:"messages"`
	// Applied: a marker exists in the scope (and the message is not parked).
	Applied int64 `json:"applied"`
	// Parked: the message is in the parked table of the scope.
	Parked int64 `json:"parked"`
	// New: no marker; the replay applies it.
	New int64 `json:"new"`
	// InvalidKey: no usable key; the replay parks it (again).
	InvalidKey int64 `json:"invalid_key"`
	// Mismatch: a marker exists with another payload fingerprint.
	Mismatch int64 `json:"mismatch"`
	// Gap: a sequence number ahead of its sender's mark (highwater strict).
	Gap int64 `json:"gap"`

	// What the consumers will report for the range once it is replayed.
	ReplayApplied   int64 `json:"replay_applied"`
	ReplayDuplicate int64 `json:"replay_duplicate"`
	ReplayMismatch  int64 `json:"replay_mismatch"`
	ReplayParked    int64 `json:"replay_parked"`
	ReplayGap       int64 `json:"replay_gap"`
}

func (c *DryRunCounts) add(o DryRunCounts) {
	c.Messages += o.Messages
	c.Applied += o.Applied
	c.Parked += o.Parked
	c.New += o.New
	c.InvalidKey += o.InvalidKey
	c.Mismatch += o.Mismatch
	c.Gap += o.Gap
	c.ReplayApplied += o.ReplayApplied
	c.ReplayDuplicate += o.ReplayDuplicate
	c.ReplayMismatch += o.ReplayMismatch
	c.ReplayParked += o.ReplayParked
	c.ReplayGap += o.ReplayGap
}

// DryRunReport is what "replay --dry-run" found.
type DryRunReport struct {
	Group      string                `json:"group"`
	Topic      string                `json:"topic"`
	Scope      string                `json:"scope"`
	Strategy   string                `json:"strategy"`
	Plan       []PartitionPlan       `json:"plan"`
	Partitions map[int]*DryRunCounts `json:"partitions"`
	Total      DryRunCounts          `json:"total"`
	Seconds    float64               `json:"seconds"`
	// Warnings say what in the settings given looks wrong: a group that
	// never ran, a key setting under which none of the messages the group
	// consumed has a marker.
	Warnings []string `json:"warnings,omitempty"`
}

// dryRun reads the plan's ranges and classifies every message by claiming
// its key, as a consumer would, in one transaction that is rolled back.
func (a *app) dryRun(cmd *cobra.Command, pool *pgxpool.Pool, kc *kafkaClient, o *replayOpts, plan []PartitionPlan) (*DryRunReport, error) {
	ctx := cmd.Context()
	s, err := a.strategy()
	if err != nil {
		return nil, err
	}
	kf, err := a.keyFunc(o.keyName)
	if err != nil {
		return nil, err
	}
	if err := prepare(ctx, pool, s); err != nil {
		return nil, err
	}
	rep := &DryRunReport{Group: o.group, Topic: o.topic, Scope: o.scope, Strategy: s.Name(), Plan: plan, Partitions: map[int]*DryRunCounts{},
		Warnings: o.warnings}

	var total int64
	for _, p := range plan {
		total += p.Messages + p.Lag
	}
	prog := newProgress(cmd.ErrOrStderr(), "reading "+o.topic, total, o.progress)
	defer prog.stop()

	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(o.lockTimeout.Milliseconds(), 10)); err != nil {
		return nil, err
	}
	store := parked.NewStore(pool, a.schema, a.parkedTable)
	if _, err := store.HasRefsTx(ctx, tx, o.scope, kafka.SourceName, nil); err != nil {
		return nil, err
	}
	cl := &classifier{app: a, o: o, tx: tx, s: s, kf: kf, parked: store}
	start := time.Now()
	for _, p := range plan {
		counts := &DryRunCounts{}
		rep.Partitions[p.Partition] = counts
		if p.End <= p.Target {
			continue
		}
		if err := cl.readPartition(ctx, kc, p, counts, prog); err != nil {
			return nil, err
		}
		rep.Total.add(*counts)
	}
	rep.Seconds = time.Since(start).Seconds()
	prog.stop()
	if cl.again > 0 && cl.againMarked == 0 {
		// The dry run's claims are released before other key settings
		// are tried on the same messages.
		_ = tx.Rollback(ctx)
		rep.Warnings = append(rep.Warnings, a.keyWarnings(ctx, pool, s, o, cl.again, cl.sample)...)
	}
	return rep, nil
}

type classifier struct {
	app *app
	o   *replayOpts
	tx  pgx.Tx
	s   dedupe.Strategy
	kf  consumer.KeyFunc
	// parked is the parked table, read in tx.
	parked *parked.Store

	// consumed is true while the messages read are ones the group consumed
	// before (before its stored offset). again counts those not parked,
	// againMarked those of them whose key has a marker, and sample holds
	// the first of them, for the key check.
	consumed           bool
	again, againMarked int64
	sample             []*consumer.Message
}

// readPartition reads [Target, End) of one partition in batches, as the
// Kafka source delivers it (committed records only, no control records):
// first the messages the group consumed before, up to its stored offset,
// then its lag.
func (c *classifier) readPartition(ctx context.Context, kc *kafkaClient, p PartitionPlan, counts *DryRunCounts, prog *progress) error {
	pos := p.Target + p.Messages
	for _, r := range []struct {
		from, to int64
		consumed bool
	}{{p.Target, pos, true}, {pos, p.End, false}} {
		if r.from >= r.to {
			continue
		}
		c.consumed = r.consumed
		err := kafka.ReadRange(ctx, kc.sourceConfig(c.o.idHeader), c.o.topic, p.Partition, r.from, r.to, c.o.batch, func(batch []*consumer.Message) error {
			if err := c.classify(ctx, batch, counts); err != nil {
				return err
			}
			prog.add(int64(len(batch)))
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// classify looks the batch's messages up in the parked table and runs them
// through the consumer's own path up to the handler (consumer.Classify) in
// the dry run's transaction.
func (c *classifier) classify(ctx context.Context, batch []*consumer.Message, counts *DryRunCounts) error {
	refs := make([]string, len(batch))
	for i, m := range batch {
		refs[i] = m.Ref
	}
	parkedRefs, err := c.parked.HasRefsTx(ctx, c.tx, c.o.scope, kafka.SourceName, refs)
	if err != nil {
		return err
	}

	cls, err := consumer.Classify(ctx, c.tx, consumer.Config{
		Name: c.o.scope, Scope: c.o.scope, Strategy: c.s, KeyFunc: c.kf,
		NoFingerprint: c.o.noFP, MaxKeyLen: c.o.maxKeyLen,
	}, batch)
	if err != nil {
		return fmt.Errorf("claim (%s): %w", c.s.Name(), err)
	}
	for i, cl := range cls {
		counts.Messages++
		isParked := parkedRefs[batch[i].Ref]
		if c.consumed && !isParked {
			c.again++
			if cl.Err == nil && (cl.Verdict == dedupe.VerdictDuplicate || cl.Verdict == dedupe.VerdictMismatch) {
				c.againMarked++
			}
			if len(c.sample) < keySample {
				c.sample = append(c.sample, batch[i])
			}
		}
		if cl.Err != nil {
			counts.ReplayParked++
			if isParked {
				counts.Parked++
			} else {
				counts.InvalidKey++
			}
			continue
		}
		switch cl.Verdict {
		case dedupe.VerdictNew:
			counts.ReplayApplied++
		case dedupe.VerdictDuplicate:
			counts.ReplayDuplicate++
		case dedupe.VerdictMismatch:
			counts.ReplayMismatch++
		case dedupe.VerdictGap:
			counts.ReplayGap++
		}
		switch {
		case isParked:
			counts.Parked++
		case cl.Verdict == dedupe.VerdictNew:
			counts.New++
		case cl.Verdict == dedupe.VerdictDuplicate:
			counts.Applied++
		case cl.Verdict == dedupe.VerdictMismatch:
			counts.Mismatch++
		case cl.Verdict == dedupe.VerdictGap:
			counts.Gap++
		}
	}
	return nil
}

func printDryRun(w io.Writer, rep *DryRunReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\ndry run for scope %s (strategy %s): nothing was written\n", rep.Scope, rep.Strategy)
	fmt.Fprintln(tw, "PARTITION\tMESSAGES\tAPPLIED\tPARKED\tNEW\tINVALID KEY\tMISMATCH\tGAP")
	row := func(name string, c *DryRunCounts) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", name, c.Messages, c.Applied, c.Parked, c.New, c.InvalidKey, c.Mismatch, c.Gap)
	}
	for _, p := range rep.Plan {
		if c := rep.Partitions[p.Partition]; c != nil {
			row(strconv.Itoa(p.Partition), c)
		}
	}
	row("total", &rep.Total)
	_ = tw.Flush()
	t := rep.Total
	fmt.Fprintf(w, "\nreplaying this range with scope %s: %d applied, %d duplicate, %d mismatch, %d parked, %d held back by a sequence gap\n",
		rep.Scope, t.ReplayApplied, t.ReplayDuplicate, t.ReplayMismatch, t.ReplayParked, t.ReplayGap)
	rate := 0.0
	if rep.Seconds > 0 {
		rate = float64(t.Messages) / rep.Seconds
	}
	fmt.Fprintf(w, "read %d message(s) in %.1fs (%.0f msg/s)\n", t.Messages, rep.Seconds, rate)
}
