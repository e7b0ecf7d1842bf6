package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/effectively-once/effectively/outbox"
	"github.com/spf13/cobra"
)

// OutboxSlot is a log relay's replication slot as "outbox stats --json"
// and "outbox health --json" print it (see outbox.SlotStatus).
type OutboxSlot struct {
	Slot          string  `json:"slot"`
	Exists        bool    `json:"exists"`
	Ready         bool    `json:"ready"`
	Active        bool    `json:"active"`
	WALStatus     string  `json:"wal_status"`
	LagBytes      int64   `json:"lag_bytes"`
	RetainedBytes int64   `json:"retained_bytes"`
	SafeWALBytes  int64   `json:"safe_wal_bytes"` // -1: max_slot_wal_keep_size unlimited
	ConfirmLagSec float64 `json:"confirm_lag_seconds"`
	// Problems is what "outbox health" found wrong; empty when healthy.
	Problems []string `json:"problems"`
}

// DefaultMaxSlotLagBytes and DefaultMaxConfirmLag are "outbox health"'s
// defaults for --max-lag-bytes and --max-confirm-lag.
const (
	DefaultMaxSlotLagBytes = 1 << 30
	DefaultMaxConfirmLag   = time.Minute
)

func outboxSlot(s outbox.SlotStatus, p outbox.SlotProblems) OutboxSlot {
	return OutboxSlot{Slot: s.Slot, Exists: s.Exists, Ready: s.Ready, Active: s.Active, WALStatus: s.WALStatus,
		LagBytes: s.LagBytes, RetainedBytes: s.RetainedBytes, SafeWALBytes: s.SafeWALBytes,
		ConfirmLagSec: s.ConfirmLag.Seconds(), Problems: append([]string{}, s.Problems(p)...)}
}

// printSlots writes one line per slot.
func printSlots(w io.Writer, slots []OutboxSlot) {
	for _, s := range slots {
		state := "ok"
		if len(s.Problems) > 0 {
			state = "PROBLEM"
		}
		reader := "no relay reads it"
		if s.Active {
			reader = "read by a relay"
		}
		wal := s.WALStatus
		if !s.Exists {
			wal = "missing"
		}
		fmt.Fprintf(w, "%s slot %s: %s, wal %s, %s behind, %s retained, confirm lag %s\n", state, s.Slot, reader, wal,
			bytesText(s.LagBytes), bytesText(s.RetainedBytes), time.Duration(s.ConfirmLagSec*float64(time.Second)).Round(time.Millisecond))
		for _, p := range s.Problems {
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// errUnhealthy is what "outbox health" returns when a slot has a problem,
// so that the command exits non-zero.
var errUnhealthy = errors.New("outbox health: a log relay's slot has problems (listed above)")

func (a *app) outboxHealthCmd(of *outboxFlags) *cobra.Command {
	var (
		asJSON bool
		p      = outbox.SlotProblems{MaxLagBytes: DefaultMaxSlotLagBytes, MaxConfirmLag: DefaultMaxConfirmLag}
	)
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Check the log relays' replication slots; exit non-zero on a problem",
		Long: `Check each replication slot a log relay created for this outbox, as the server
sees it (so it tells the truth when no relay runs): the slot exists and is not
invalidated (wal_status lost, or unreserved: past max_slot_wal_keep_size), a
relay reads it, it is no more than --max-lag-bytes behind the server's WAL, and
the reading relay confirms within --max-confirm-lag. Prints one line per slot
and exits non-zero when any has a problem, for a health check or an alert. An
outbox with no slot (the table-polling relay) is healthy here: see "outbox
stats" for its backlog. Reading pg_stat_replication's lag needs
pg_read_all_stats; without it the confirm lag reads 0.`,
		Example: `  effectively outbox health
  effectively outbox health --max-lag-bytes 268435456 --max-confirm-lag 30s --json`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			o, err := a.outbox(of)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			st, err := o.Slots(ctx, pool)
			if err != nil {
				return err
			}
			slots := []OutboxSlot{}
			bad := false
			for _, s := range st {
				slots = append(slots, outboxSlot(s, p))
				bad = bad || len(slots[len(slots)-1].Problems) > 0
			}
			if asJSON {
				if err := writeJSON(cmd.OutOrStdout(), slots); err != nil {
					return err
				}
			} else if len(slots) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "ok: no log relay slot for this outbox (the table-polling relay, or no log relay started yet)")
			} else {
				printSlots(cmd.OutOrStdout(), slots)
			}
			if bad {
				return errUnhealthy
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().Int64Var(&p.MaxLagBytes, "max-lag-bytes", p.MaxLagBytes, "most bytes of WAL a slot may be behind (0: not checked)")
	cmd.Flags().DurationVar(&p.MaxConfirmLag, "max-confirm-lag", p.MaxConfirmLag, "longest the reading relay may take to confirm (0: not checked)")
	cmd.Flags().BoolVar(&p.AllowInactive, "allow-inactive", false, "accept a slot no relay reads (a planned stop)")
	return cmd
}
