package cli

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/spf13/cobra"
)

const keyHelp = `Key functions (--key): "id" (the message's default ID: the idempotency-key
header, else topic/partition/offset), "offset" (sender topic/partition and
sequence offset+1, for highwater in monotonic mode), "json:FIELD" (a top-level
field of a JSON payload), "headers:SENDER,SEQ" (sender and sequence number from
two headers), or a name registered by the embedding program.`

func (a *app) redriveCmd() *cobra.Command {
	var (
		f       parkedFilter
		handler string
		keyName string
	)
	cmd := &cobra.Command{
		Use:   "redrive",
		Short: "Run parked messages through a handler again, applying each once",
		Long: `Run the parked messages of one scope through a registered handler again,
oldest first. Each message runs in a transaction of its own that also deletes
its parked row, inside the normal protocol: a message parked without a marker
has its key claimed first (if another delivery applied it meanwhile it is
removed as a duplicate), and a message that fails again stays parked with its
attempts and last error updated. Two redrives of the same rows at once apply
each message once: the second waits for the first's row lock and then finds
the row gone. It is safe while consumers run.

The stock binary has no handlers: a team builds its own binary that embeds
this command tree with its handlers registered by name:

	root := cli.NewRoot(cli.Options{Handlers: map[string]consumer.Handler{"ledger": apply}})
	_ = root.ExecuteContext(ctx)

Messages parked with reason invalid_key have no key: they are skipped unless
--key names a key function that derives one. A row that counts several
parkings of the same message (COUNT) is applied once. --ref selects rows by
their ref as "parked list" shows it; every row under that ref is redriven.

` + keyHelp,
		Example: `  ledger-ops parked redrive --scope ledger --handler ledger --reason permanent
  ledger-ops parked redrive --scope ledger --handler ledger --id 42 --yes
  ledger-ops parked redrive --scope ledger --handler ledger --ref '"orders/0@7\xff"'`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if f.scope == "" {
				return errors.New("--scope is required: redrive works on one scope at a time")
			}
			pf, err := f.filter()
			if err != nil {
				return err
			}
			h, bh, err := a.handler(handler)
			if err != nil {
				return err
			}
			var kf consumer.KeyFunc
			if keyName != "" {
				if kf, err = a.keyFunc(keyName); err != nil {
					return err
				}
			}
			s, err := a.strategy()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			if err := prepare(ctx, pool, s); err != nil {
				return err
			}
			// The rows counted in the question are the rows redriven: one
			// parked while the question waits is left alone.
			ids, err := parked.NewStore(pool, a.schema, a.parkedTable).IDs(ctx, pf)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(ids) == 0 {
				fmt.Fprintln(out, "no parked message matches")
				return nil
			}
			if err := a.confirm(cmd, fmt.Sprintf("Redrive %d parked message(s) of scope %q through handler %q?", len(ids), f.scope, handler)); err != nil {
				return err
			}
			res, err := consumer.Redrive(ctx, pool, consumer.Config{
				Name: f.scope, Strategy: s, Handler: h, BatchHandler: bh, KeyFunc: kf,
				Schema: a.schema, ParkedTable: a.parkedTable,
			}, parked.Filter{IDs: ids, Refs: pf.Refs, Reason: pf.Reason})
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tREF\tCOUNT\tREASON\tOUTCOME\tERROR")
			for _, it := range res.Items {
				msg := ""
				if it.Err != nil {
					msg = shorten(it.Err.Error(), 100)
				}
				ref, count := "-", "-"
				if it.Outcome != parked.RedriveGone {
					ref, count = showRef(it.Ref), strconv.Itoa(it.ParkCount)
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", it.ID, ref, count, orDash(it.Reason), it.Outcome, msg)
			}
			_ = tw.Flush()
			fmt.Fprintf(out, "applied %d, duplicate %d, failed %d, skipped %d, gone %d\n",
				res.Applied, res.Duplicate, res.Failed, res.Skipped, res.Gone)
			if err != nil {
				return err
			}
			if res.Failed > 0 {
				return fmt.Errorf("%d message(s) failed again and stay parked", res.Failed)
			}
			return nil
		}),
	}
	f.flags(cmd.Flags(), 0)
	cmd.Flags().StringVar(&handler, "handler", "", "name of the registered handler to run (required)")
	cmd.Flags().StringVar(&keyName, "key", "", "key function for messages parked without a key (see below)")
	return cmd
}

// handler looks up a registered handler.
func (a *app) handler(name string) (consumer.Handler, consumer.BatchHandler, error) {
	if h, ok := a.opts.Handlers[name]; ok && name != "" {
		return h, nil, nil
	}
	if h, ok := a.opts.BatchHandlers[name]; ok && name != "" {
		return nil, h, nil
	}
	var names []string
	for n := range a.opts.Handlers {
		names = append(names, n)
	}
	for n := range a.opts.BatchHandlers {
		names = append(names, n)
	}
	sort.Strings(names)
	what := fmt.Sprintf("no handler named %q", name)
	if name == "" {
		what = "--handler is required"
	}
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("%s: this %s binary has no handlers registered. Redrive runs your handler, "+
			"so build your own binary embedding the command tree with them: "+
			"cli.NewRoot(cli.Options{Handlers: map[string]consumer.Handler{\"name\": yourHandler}}) "+
			"(package github.com/effectively-once/effectively/cli; see docs/replay.md)", what, a.opts.Name)
	}
	return nil, nil, fmt.Errorf("%s; registered handlers: %s", what, strings.Join(names, ", "))
}

// keyFunc resolves a --key name.
func (a *app) keyFunc(name string) (consumer.KeyFunc, error) {
	if kf, ok := a.opts.KeyFuncs[name]; ok {
		return kf, nil
	}
	switch {
	case name == "id":
		return consumer.DefaultKey, nil
	case name == "offset":
		return offsetKey, nil
	case strings.HasPrefix(name, "json:") && len(name) > 5:
		return consumer.JSONField(name[5:]), nil
	case strings.HasPrefix(name, "headers:"):
		parts := strings.Split(name[8:], ",")
		if len(parts) == 2 && parts[0] != "" && parts[1] != "" {
			return kafka.SequenceKey(parts[0], parts[1]), nil
		}
	}
	var names []string
	for n := range a.opts.KeyFuncs {
		names = append(names, n)
	}
	sort.Strings(names)
	reg := ""
	if len(names) > 0 {
		reg = "; registered: " + strings.Join(names, ", ")
	}
	return nil, fmt.Errorf("--key: unknown key function %q: use id, offset, json:FIELD or headers:SENDER,SEQ%s", name, reg)
}

// offsetKey is the sender topic/partition and sequence offset+1, read from
// a Kafka message's Ref ("topic/partition@offset").
func offsetKey(m *consumer.Message) (dedupe.Key, error) {
	i := strings.LastIndexByte(m.Ref, '@')
	if i < 0 {
		return dedupe.Key{}, fmt.Errorf("ref %q is not topic/partition@offset", m.Ref)
	}
	off, err := strconv.ParseInt(m.Ref[i+1:], 10, 64)
	if err != nil || off < 0 {
		return dedupe.Key{}, fmt.Errorf("ref %q is not topic/partition@offset", m.Ref)
	}
	return dedupe.Key{ID: m.ID, Sender: m.Ref[:i], Seq: off + 1}, nil
}
