package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// replayOpts are the flags of the replay command.
type replayOpts struct {
	brokers     []string
	group       string
	topic       string
	scope       string
	toTime      string
	toOffset    []string
	partitions  []int
	dryRun      bool
	asJSON      bool
	keyName     string
	idHeader    string
	noFP        bool
	maxKeyLen   int
	batch       int
	progress    string
	lockTimeout time.Duration
	newGroup    bool
	// warnings are what the plan found that a dry run reports rather than
	// refuses.
	warnings []string
	conn     kafkaConn
}

// PartitionPlan is one partition of a replay: where its stored offset is and
// where the replay moves it.
type PartitionPlan struct {
	Partition int `json:"partition"`
	// Stored is the next offset stored in Postgres; nil when the group has
	// no row for the partition.
	Stored     *int64 `json:"stored"`
	Generation int32  `json:"generation"`
	// First and End are the partition's first and next-to-be-written offsets.
	First int64 `json:"first"`
	End   int64 `json:"end"`
	// Target is the offset the replay stores: the group's consumers read
	// [Target, End) once it is done.
	Target int64 `json:"target"`
	// Messages counts the messages delivered again: [Target, Stored), which
	// the group consumed before and reads once more. It is 0 for a
	// partition with no stored offset, where the group consumed nothing
	// that the replay can move back over.
	Messages int64 `json:"messages"`
	// Lag counts the messages after those, [Stored, End) (from Target when
	// no offset is stored): the group has not consumed them yet, and its
	// consumers read them after the replay as they would have without it.
	Lag int64 `json:"lag"`
	// Clamped is true when the requested offset was before First (removed
	// by retention) and the replay starts at First instead.
	Clamped bool `json:"clamped,omitempty"`
}

func (a *app) replayCmd() *cobra.Command {
	var o replayOpts
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Move a Kafka group's offsets stored in Postgres back, to process a range again",
		Long: `Move the next offsets that a consumer group stores in Postgres (the offsets
table of sources/kafka) back to a point in time (--to-time) or to explicit
offsets (--to-offset), for one group and topic, so that its consumers deliver
that range again when they start. Messages already applied in the consumers'
scope are then recognised as duplicates and skipped; messages that were not
applied (skipped by a bug, say) are applied. To recompute effects instead,
replay into a new scope (see docs/replay.md).

--dry-run writes nothing: it reads the range from Kafka and reports, for
--scope, how many of its messages are already applied (a marker exists: the
replay skips them as duplicates), parked, and new (the replay applies them),
with a progress bar and rate on stderr while it reads. It claims the range's
keys in one transaction that it rolls back, exactly as a consumer would claim
them, so it also counts repeats within the range; a consumer that meets one
of those keys meanwhile waits for that transaction (at most --lock-timeout).

Safety while consumers run: a running consumer keeps its position in memory
and its next commit stores the greater of the stored offset and its own, so
it would silently undo a replay. The replay therefore requires the group to
have no active members in Kafka: stop its consumers first. It locks the
group's rows, checks the group's membership, and writes, in that order and in
one transaction, so a consumer that starts meanwhile waits for the replay and
then starts from the replayed offsets. The rows' generation is left alone:
the next generation claims the rows as usual and seeks to the stored offset.
The replay only moves offsets back; a target after the stored offset would
skip messages and is refused. The offsets committed to Kafka (used only for
lag monitoring) are left alone; the consumers overwrite them as they go.
Consumers running with KafkaOffsetsOnly keep no offsets in Postgres: reset
those with Kafka's own tools instead.

A group with no offsets stored for the topic and no members in Kafka has
never run here: most likely --group or --topic is misspelt, and the replay
refuses it (a dry run warns). To start a group that has not run yet at the
replayed offsets (a second group that recomputes into a new scope, say),
give --new-group. A group with offsets committed to Kafka but none stored
in Postgres runs with KafkaOffsetsOnly, and is refused as such.

The plan counts, per partition, the messages delivered again (AGAIN: from
the replayed offset to the stored one, which the group consumed before) and
the group's LAG after them (from the stored offset to the end, which the
consumers read anyway). The dry run reads both, as the consumers will.

` + keyHelp + "\n\n" + kafkaConnHelp,
		Example: `  effectively replay --brokers kafka:9092 --group ledger --topic transfers --scope ledger --to-time 2026-11-28T09:00:00Z --dry-run
  effectively replay --brokers kafka:9092 --group ledger --topic transfers --to-time 6h
  effectively replay --brokers kafka:9092 --group ledger --topic transfers --to-offset 0=1200,1=1187 --yes
  effectively replay --brokers kafka:9093 --tls-ca ca.pem --sasl-mechanism SCRAM-SHA-512 --sasl-username ops \
      --sasl-password-file /run/secrets/kafka-password --group ledger --topic transfers --to-time 6h`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return a.replay(cmd, &o)
		}),
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.brokers, "brokers", nil, "Kafka brokers (host:port, comma-separated; required)")
	f.StringVar(&o.group, "group", "", "consumer group whose stored offsets move (required)")
	f.StringVar(&o.topic, "topic", "", "topic (required)")
	f.StringVar(&o.scope, "scope", "", "scope of the consumers' markers (required with --dry-run)")
	f.StringVar(&o.toTime, "to-time", "", "replay from the first message at or after this time: RFC 3339, or a duration ago such as 6h")
	f.StringSliceVar(&o.toOffset, "to-offset", nil, "replay from these offsets: OFFSET for every partition, or PARTITION=OFFSET,...")
	f.IntSliceVar(&o.partitions, "partitions", nil, "only these partitions (default all)")
	f.BoolVar(&o.dryRun, "dry-run", false, "read the range and report applied, parked and new messages; write nothing")
	f.BoolVar(&o.asJSON, "json", false, "print the plan (and the dry-run report) as JSON")
	f.StringVar(&o.keyName, "key", "id", "key function the consumers use (dry-run; see below)")
	f.StringVar(&o.idHeader, "id-header", "idempotency-key", "header holding a message's default ID, as the consumers' IDHeader (dry-run)")
	f.BoolVar(&o.noFP, "no-fingerprint", false, "the consumers run with NoFingerprint (dry-run)")
	f.IntVar(&o.maxKeyLen, "max-key-len", 0, "the consumers' MaxKeyLen (dry-run; default 512)")
	f.IntVar(&o.batch, "batch", 500, "messages claimed per statement (dry-run)")
	f.StringVar(&o.progress, "progress", "auto", "progress bar on stderr: auto (when it is a terminal), always or never")
	f.DurationVar(&o.lockTimeout, "lock-timeout", 30*time.Second, "longest wait for a marker locked by a running consumer (dry-run)")
	f.BoolVar(&o.newGroup, "new-group", false, "allow a group with no offsets stored for the topic and no members: create its offsets at the replayed ones")
	o.conn = a.kafkaConn()
	o.conn.addFlags(f)
	return cmd
}

func (a *app) replay(cmd *cobra.Command, o *replayOpts) error {
	if err := o.conn.fromEnv(cmd.Flags()); err != nil {
		return err
	}
	switch {
	case len(o.brokers) == 0:
		return errors.New("--brokers is required (or $EFFECTIVELY_KAFKA_BROKERS)")
	case o.group == "":
		return errors.New("--group is required")
	case o.topic == "":
		return errors.New("--topic is required")
	case (o.toTime == "") == (len(o.toOffset) == 0):
		return errors.New("give exactly one of --to-time and --to-offset")
	case o.dryRun && o.scope == "":
		return errors.New("--scope is required with --dry-run: it names the markers that decide what is already applied")
	case o.batch < 1:
		return errors.New("--batch must be at least 1")
	}
	switch o.progress {
	case "auto", "always", "never":
	default:
		return fmt.Errorf("--progress: %q is not auto, always or never", o.progress)
	}
	ctx := cmd.Context()
	kc, err := newKafkaClient(ctx, o.brokers, &o.conn, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer kc.close()
	pool, err := a.db(ctx)
	if err != nil {
		return err
	}
	plan, err := a.plan(ctx, pool, kc, o)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if o.dryRun {
		rep, err := a.dryRun(cmd, pool, kc, o, plan)
		if err != nil {
			return err
		}
		if o.asJSON {
			err = writeJSON(out, rep)
		} else {
			printPlan(out, o, plan)
			printDryRun(out, rep)
		}
		for _, w := range rep.Warnings {
			fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+w)
		}
		return err
	}
	if o.asJSON {
		if err := writeJSON(out, plan); err != nil {
			return err
		}
	} else {
		printPlan(out, o, plan)
	}
	again, lag := planTotals(plan)
	if err := a.confirm(cmd, fmt.Sprintf("Move the stored offsets of group %q on %s back, so that %d message(s) are delivered again (and then the %d of its lag)?",
		o.group, o.topic, again, lag)); err != nil {
		return err
	}
	if err := a.applyReplay(ctx, pool, kc, o, plan); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "stored offsets moved: start the consumers of group %q; they read %d message(s) again, then the %d of their lag\n", o.group, again, lag)
	return nil
}

// plan reads the stored offsets and the partitions' bounds and works out
// each partition's target.
func (a *app) plan(ctx context.Context, pool *pgxpool.Pool, kc *kafkaClient, o *replayOpts) ([]PartitionPlan, error) {
	parts, err := kc.partitions(ctx, o.topic)
	if err != nil {
		return nil, err
	}
	stored, err := a.storedOffsets(ctx, pool, o.group, o.topic, parts)
	if err != nil {
		return nil, err
	}
	if len(stored) == 0 && !o.newGroup {
		unknown, err := a.unknownGroup(ctx, pool, kc, o, parts)
		switch {
		case err != nil:
			return nil, err
		case unknown != "" && o.dryRun:
			o.warnings = append(o.warnings, unknown+" (the replay itself refuses it without --new-group)")
		case unknown != "":
			return nil, errors.New(unknown + ". Nothing was written")
		}
	}
	if len(o.partitions) > 0 {
		have := map[int]bool{}
		for _, p := range parts {
			have[p] = true
		}
		for _, p := range o.partitions {
			if !have[p] {
				return nil, fmt.Errorf("--partitions: topic %s has no partition %d", o.topic, p)
			}
		}
		parts = append([]int(nil), o.partitions...)
		sort.Ints(parts)
		parts = compactInts(parts)
	}
	first, end, err := kc.bounds(ctx, o.topic, parts)
	if err != nil {
		return nil, err
	}
	var targets map[int]int64
	explicit := false
	if o.toTime != "" {
		t, err := parseWhen(o.toTime, time.Now())
		if err != nil {
			return nil, err
		}
		if targets, err = kc.offsetsAt(ctx, o.topic, parts, t, end); err != nil {
			return nil, err
		}
	} else {
		explicit = true
		if targets, err = parseOffsets(o.toOffset, parts); err != nil {
			return nil, err
		}
	}
	plan := make([]PartitionPlan, 0, len(parts))
	for _, p := range parts {
		pp := PartitionPlan{Partition: p, First: first[p], End: end[p], Target: targets[p]}
		if s, ok := stored[p]; ok {
			pp.Stored, pp.Generation = s.Next, s.Generation
		}
		if explicit && pp.Target > pp.End {
			return nil, fmt.Errorf("--to-offset: %s/%d ends at offset %d, before %d", o.topic, p, pp.End, pp.Target)
		}
		if pp.Target < pp.First {
			pp.Target, pp.Clamped = pp.First, true
		}
		if pp.Stored != nil && pp.Target > *pp.Stored {
			return nil, fmt.Errorf("%s/%d: the target offset %d is after the stored offset %d: replay only moves offsets back (moving forward would skip messages)",
				o.topic, p, pp.Target, *pp.Stored)
		}
		// Where the group is: the stored offset, or nowhere it knows of.
		pos := pp.Target
		if pp.Stored != nil {
			pos = min(max(*pp.Stored, pp.Target), pp.End)
		}
		pp.Messages, pp.Lag = pos-pp.Target, max(pp.End-pos, 0)
		plan = append(plan, pp)
	}
	return plan, nil
}

// planTotals sums the plan's messages delivered again and its lag.
func planTotals(plan []PartitionPlan) (again, lag int64) {
	for _, p := range plan {
		again += p.Messages
		lag += p.Lag
	}
	return again, lag
}

// unknownGroup says why a group that has no offsets stored for the topic
// (the caller checked) is refused when it has no members in Kafka either:
// it never ran here, and a replay would create offsets for a name that is
// most likely misspelt, or it runs with KafkaOffsetsOnly, which keeps its
// positions in Kafka only. It returns "" for a group with members.
func (a *app) unknownGroup(ctx context.Context, pool *pgxpool.Pool, kc *kafkaClient, o *replayOpts, parts []int) (string, error) {
	_, members, err := kc.groupMembers(ctx, o.group)
	if err != nil || members > 0 {
		return "", err
	}
	committed, err := kc.committed(ctx, o.group, o.topic, parts)
	if err != nil {
		return "", err
	}
	if committed > 0 {
		return fmt.Sprintf("group %q has offsets committed to Kafka for topic %s but none stored in %s: its consumers run with KafkaOffsetsOnly, "+
			"whose positions replay does not move; reset those with Kafka's own tools (kafka-consumer-groups --reset-offsets) while the group is stopped. "+
			"If its offsets in Postgres were lost instead (a restore), give --new-group to store the replayed ones",
			o.group, o.topic, a.offsets().Table()), nil
	}
	rows, err := a.offsets().List(ctx, pool, "")
	if err != nil {
		return "", err
	}
	var groups []string
	for _, r := range rows {
		if r.Topic == o.topic && !slices.Contains(groups, r.Group) {
			groups = append(groups, r.Group)
		}
	}
	known := fmt.Sprintf("no group has offsets stored for %s", o.topic)
	if len(groups) > 0 {
		known = fmt.Sprintf("groups with offsets stored for %s: %s", o.topic, strings.Join(groups, ", "))
	}
	return fmt.Sprintf("group %q has no offsets stored for topic %s in %s and no members in Kafka: it has never run here (%s). "+
		"Check --group and --topic; to create the offsets of a group that has not run yet, so that it starts at the replayed offsets, give --new-group",
		o.group, o.topic, a.offsets().Table(), known), nil
}

// storedOffsets reads the group's rows for parts.
func (a *app) storedOffsets(ctx context.Context, pool *pgxpool.Pool, group, topic string, parts []int) (map[int]kafka.StoredOffset, error) {
	offs := a.offsets()
	exists, err := offs.Exists(ctx, pool)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, fmt.Errorf("table %s does not exist: the consumers keep their offsets elsewhere (KafkaOffsetsOnly?) or --schema/--offsets-table are wrong", offs.Table())
	}
	return offs.Read(ctx, pool, group, topic, parts)
}

// applyReplay writes the plan: rows are created or locked, the group is
// checked for members under the locks, and the targets are stored, in one
// transaction.
func (a *app) applyReplay(ctx context.Context, pool *pgxpool.Pool, kc *kafkaClient, o *replayOpts, plan []PartitionPlan) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	parts := make([]int, len(plan))
	targets := make(map[int]int64, len(plan))
	for i, p := range plan {
		parts[i], targets[p.Partition] = p.Partition, p.Target
	}
	// Rows the group does not have yet are created (without an offset), so
	// that they are locked like the others.
	offs := a.offsets()
	stored, err := offs.LockTx(ctx, tx, o.group, o.topic, parts)
	if err != nil {
		return err
	}
	for _, p := range plan {
		s := stored[p.Partition]
		if !sameOffset(s.Next, p.Stored) {
			return fmt.Errorf("%s/%d: the stored offset moved from %s to %s since the plan: are consumers of group %q running? Nothing was written",
				o.topic, p.Partition, fmtInt(p.Stored), fmtInt(s.Next), o.group)
		}
	}
	state, members, err := kc.groupMembers(ctx, o.group)
	if err != nil {
		return err
	}
	if members > 0 {
		return fmt.Errorf("group %q has %d active member(s) (state %s): stop its consumers first, since a running consumer would undo the replay "+
			"(a consumer that crashed stays a member until its session times out). Nothing was written", o.group, members, state)
	}
	if err := offs.SeekTx(ctx, tx, o.group, o.topic, targets); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("offsets: commit: %w", err)
	}
	return nil
}

func sameOffset(a, b *int64) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// parseWhen reads an RFC 3339 time or a duration before now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--to-time: %q is neither an RFC 3339 time (2026-11-28T09:00:00Z) nor a duration ago (6h)", s)
}

// parseOffsets reads "OFFSET" (every partition) or "P=OFFSET" entries.
func parseOffsets(specs []string, parts []int) (map[int]int64, error) {
	out := map[int]int64{}
	all := int64(-1)
	for _, s := range specs {
		s = strings.TrimSpace(s)
		if p, off, ok := strings.Cut(s, "="); ok {
			pn, err1 := strconv.Atoi(strings.TrimSpace(p))
			on, err2 := strconv.ParseInt(strings.TrimSpace(off), 10, 64)
			if err1 != nil || err2 != nil || pn < 0 || on < 0 {
				return nil, fmt.Errorf("--to-offset: %q is not PARTITION=OFFSET", s)
			}
			out[pn] = on
			continue
		}
		on, err := strconv.ParseInt(s, 10, 64)
		if err != nil || on < 0 {
			return nil, fmt.Errorf("--to-offset: %q is neither an offset nor PARTITION=OFFSET", s)
		}
		all = on
	}
	res := map[int]int64{}
	for _, p := range parts {
		switch off, ok := out[p]; {
		case ok:
			res[p] = off
		case all >= 0:
			res[p] = all
		default:
			return nil, fmt.Errorf("--to-offset: no offset given for partition %d (give OFFSET for all, or limit --partitions)", p)
		}
	}
	for p := range out {
		if _, ok := res[p]; !ok {
			return nil, fmt.Errorf("--to-offset: partition %d is not replayed (see --partitions)", p)
		}
	}
	return res, nil
}

func printPlan(w io.Writer, o *replayOpts, plan []PartitionPlan) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "group %s, topic %s\n", o.group, o.topic)
	fmt.Fprintln(tw, "PARTITION\tSTORED NEXT OFFSET\tGENERATION\tFIRST\tEND\tREPLAY FROM\tAGAIN\tLAG")
	for _, p := range plan {
		note := ""
		if p.Clamped {
			note = " (earlier messages are gone: retention)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d%s\t%d\t%d\n", p.Partition, fmtInt(p.Stored), p.Generation, p.First, p.End, p.Target, note, p.Messages, p.Lag)
	}
	_ = tw.Flush()
	again, lag := planTotals(plan)
	fmt.Fprintf(w, "%d message(s) delivered again (from REPLAY FROM to the stored offset), then the group's lag of %d\n", again, lag)
}
