package consumer_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/jackc/pgx/v5"
)

// The ledger check of an invariant run. Every logical message ends in
// exactly one place:
//
//   - a good message (with all its producer copies) has exactly one effect,
//     whose payload is the published value (nil stays NULL), and is not
//     parked;
//   - a poison message has no effect and is parked at least once. Each
//     parked row is whole (its payload is the published value, nil stays
//     NULL); a row parked with its marker is the only such row of its
//     logical message (every later copy is a duplicate; a second row would
//     be applied twice by a redrive); and every stored message the
//     consumer reported parked has a row of its own (no parked row may be
//     lost, whatever its ref);
//   - with highwater, a sender's messages apply in seq order, and a parked
//     poison message holds its sender back only until it is parked: its
//     marker moves the mark past it, so the sender's later messages apply.
//
// Nothing else is in the effects or parked tables.

type parkedEntry struct {
	ID        int64
	Reason    string
	HasMarker bool
	Payload   []byte
	Copy      *string // the x-copy header
	Ref       string  // as text
}

// problem is one broken invariant: its kind (one of problemKinds) and a
// description naming the message and what happened to it.
type problem struct {
	kind, msg string
}

// problemKinds, most serious first: the order failures are shown in.
var problemKinds = []string{
	"lost",          // a message with no effect and no parked row
	"effects",       // a message with the wrong number of effects
	"row-lost",      // a parked delivery whose row is gone
	"good-parked",   // a good message parked
	"parked-twice",  // a message parked more than once with its marker
	"order",         // a sender's messages applied out of order
	"parked-value",  // a parked row whose payload is not the value
	"effect-value",  // an effect whose payload is not the value
	"marker",        // a parked row with the wrong has_marker
	"reason",        // a parked row with the wrong reason
	"unknown",       // a row of no published message
	"handler-value", // a delivery whose value is not the published one
}

// check returns every broken invariant.
func (r *invRun) check(ctx context.Context) []problem {
	var problems []problem
	bad := func(kind string, l *logical, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if l != nil {
			msg += "\n" + r.history(l)
			if r.strat.ordered {
				msg += r.neighbours(l)
			}
		}
		problems = append(problems, problem{kind, msg})
	}
	byID := map[string]*logical{}
	for _, l := range r.p.logicals {
		byID[l.id] = l
	}

	// Effects.
	rows, err := r.admin.Query(ctx, `SELECT logical, copy, sender, seq, payload FROM effects ORDER BY n`)
	if err != nil {
		r.t.Fatal(err)
	}
	effects := map[string]int{}
	last := map[string]int64{}
	var (
		id, sender string
		cp         int
		seq        int64
		payload    []byte
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &cp, &sender, &seq, &payload}, func() error {
		l := byID[id]
		if l == nil {
			bad("unknown", nil, "an effect of unknown message %q", id)
			return nil
		}
		effects[id]++
		if !sameValue(payload, l.value) {
			bad("effect-value", l, "%s: effect (copy #%d) has payload %s, published %s", l.id, cp, showValue(payload), showValue(l.value))
		}
		if r.strat.ordered {
			if seq <= last[sender] {
				bad("order", l, "%s: %s#%d applied after %s#%d: out of its sender's order", l.id, sender, seq, sender, last[sender])
			}
			last[sender] = max(last[sender], seq)
		}
		return nil
	}); err != nil {
		r.t.Fatal(err)
	}

	// Parked rows.
	rows, err = r.admin.Query(ctx, `SELECT id, reason, has_marker, payload,
		    (SELECT h->>'value' FROM jsonb_array_elements(headers) h WHERE h->>'key' = 'x-copy' LIMIT 1), ref::text
		FROM parked ORDER BY id`)
	if err != nil {
		r.t.Fatal(err)
	}
	parked, err := pgx.CollectRows(rows, pgx.RowToStructByPos[parkedEntry])
	if err != nil {
		r.t.Fatal(err)
	}
	rowsOf := map[string][]parkedEntry{} // by logical
	rowOfCopy := map[int]bool{}
	for _, p := range parked {
		var s *stored
		if p.Copy != nil {
			if i, err := strconv.Atoi(*p.Copy); err == nil && i >= 0 && i < len(r.p.stored) {
				s = r.p.stored[i]
			}
		}
		if s == nil {
			bad("unknown", nil, "parked row %d is of no published message (x-copy header %v)", p.ID, p.Copy)
			continue
		}
		l := s.logical
		rowsOf[l.id] = append(rowsOf[l.id], p)
		rowOfCopy[s.serial] = true
		if !l.kind.poison() {
			bad("good-parked", l, "%s: good message parked (row %d, copy #%d, reason %s)", l.id, p.ID, s.serial, p.Reason)
			continue
		}
		if !sameValue(p.Payload, l.value) {
			bad("parked-value", l, "%s: parked row %d (copy #%d) has payload %s, published %s", l.id, p.ID, s.serial, showValue(p.Payload), showValue(l.value))
		}
		if p.HasMarker != l.kind.withMarker() {
			bad("marker", l, "%s: parked row %d (copy #%d, %s) has has_marker=%v, want %v", l.id, p.ID, s.serial, l.kind, p.HasMarker, l.kind.withMarker())
		}
		if want := wantReasons(l.kind); !slices.Contains(want, p.Reason) {
			bad("reason", l, "%s: parked row %d (copy #%d, %s) has reason %q, want one of %q", l.id, p.ID, s.serial, l.kind, p.Reason, want)
		}
	}

	// Every logical message in its one place. After a stuck run, a message
	// the broker still holds may rightly be nowhere yet.
	unsettled := map[*logical]bool{}
	for _, pm := range r.broker.Pending() {
		if s := r.storedOf(&pm.Message); s != nil {
			unsettled[s.logical] = true
		}
	}
	for _, l := range r.p.logicals {
		n, rs := effects[l.id], rowsOf[l.id]
		switch {
		case unsettled[l] && n == 0 && len(rs) == 0:
			// still to be delivered: see the stuck report
		case !l.kind.poison() && n == 0 && len(rs) == 0:
			bad("lost", l, "%s: good message lost: no effect and not parked", l.id)
		case !l.kind.poison() && n != 1:
			bad("effects", l, "%s: good message has %d effects, want 1", l.id, n)
		case l.kind.poison() && n != 0:
			bad("effects", l, "%s: %s message has %d effects, want 0", l.id, l.kind, n)
		}
		if l.kind.poison() && len(rs) == 0 && !unsettled[l] {
			bad("lost", l, "%s: %s message lost: not parked", l.id, l.kind)
		}
		if markers := countMarkers(rs); markers > 1 {
			bad("parked-twice", l, "%s: parked %d times with its marker; a redrive would apply it %d times", l.id, markers, markers)
		}
		for _, s := range l.copies {
			if r.reported[s.serial] && !rowOfCopy[s.serial] {
				bad("row-lost", l, "%s: copy #%d (ref %s) was parked (the consumer reported it), but no parked row holds it%s",
					l.id, s.serial, r.refOf(s), r.sameRef(parked, r.refs[s.serial]))
			}
		}
	}
	for _, v := range r.violations {
		problems = append(problems, problem{"handler-value", "handler saw: " + v})
	}
	return problems
}

// sameRef names the parked rows whose ref is ref made valid text, the
// way refs were stored when this test was written: the rows that took the
// lost one's place.
func (r *invRun) sameRef(parked []parkedEntry, ref string) string {
	clean := strings.ReplaceAll(strings.ToValidUTF8(ref, "\uFFFD"), "\x00", "\uFFFD")
	var out []string
	for _, p := range parked {
		if p.Ref != clean && p.Ref != ref {
			continue
		}
		owner := "no published message"
		if p.Copy != nil {
			if i, err := strconv.Atoi(*p.Copy); err == nil && i >= 0 && i < len(r.p.stored) {
				o := r.p.stored[i]
				owner = fmt.Sprintf("copy #%d of %s (%s), ref %s", o.serial, o.logical.id, o.logical.kind, r.refOf(o))
			}
		}
		out = append(out, fmt.Sprintf("row %d, of %s", p.ID, owner))
	}
	if len(out) == 0 {
		return ""
	}
	return "; its ref, made valid text, is that of " + strings.Join(out, ", ")
}

func wantReasons(k kind) []string {
	switch k {
	case poisonPermanent:
		return []string{parked.ReasonPermanent}
	case poisonExhaust:
		return []string{parked.ReasonMaxAttempts}
	case poisonKey:
		return []string{parked.ReasonInvalidKey}
	}
	// A failure at COMMIT: retried and then parked; whether the engine
	// calls it permanent is its choice.
	return []string{parked.ReasonMaxAttempts, parked.ReasonPermanent}
}

func countMarkers(rs []parkedEntry) int {
	n := 0
	for _, p := range rs {
		if p.HasMarker {
			n++
		}
	}
	return n
}

// sameValue reports whether a stored value is the published one, nil and
// empty being different.
func sameValue(got, want []byte) bool {
	return (got == nil) == (want == nil) && bytes.Equal(got, want)
}

// refOf returns the ref the broker gave s, quoted.
func (r *invRun) refOf(s *stored) string { return quoteRef(r.refs[s.serial]) }

// history describes a logical message and what happened to each of its copies.
func (r *invRun) history(l *logical) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "    %s: %s, sender %s seq %d, value %s, transient failures %d, %d copies\n",
		l.id, l.kind, l.sender, l.seq, showValue(l.value), l.transient, len(l.copies))
	for _, s := range l.copies {
		var faults []string
		for a, f := range s.faults {
			faults = append(faults, fmt.Sprintf("%s at attempt %d", f, a))
		}
		slices.Sort(faults)
		fmt.Fprintf(&b, "      copy #%d in lane %d at %d of %d, ref %s, faults %v:\n", s.serial, s.lane,
			indexOf(r.p.order[s.lane], s), len(r.p.order[s.lane]), quoteRef(r.refs[s.serial]), faults)
		for _, e := range r.events[s.serial] {
			fmt.Fprintf(&b, "        %s\n", e)
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// neighbours describes the messages of l's sender just before and after
// it: with sequences, what happened to one depends on them.
func (r *invRun) neighbours(l *logical) string {
	var b strings.Builder
	for _, o := range r.p.logicals {
		if o != l && o.sender == l.sender && o.kind != poisonKey && o.seq >= l.seq-2 && o.seq <= l.seq+2 {
			fmt.Fprintf(&b, "\n    its sender's\n%s", r.history(o))
		}
	}
	return b.String()
}

// stuckReport describes what a stuck run is waiting for: the first few
// unacknowledged messages of each lane, the first of them being what holds
// the lane.
func (r *invRun) stuckReport() string {
	var b strings.Builder
	pending := r.broker.Pending()
	fmt.Fprintf(&b, "%d messages unacknowledged", len(pending))
	b.WriteString(r.activity())
	seen := map[string]bool{}
	perLane := map[string]int{}
	for _, p := range pending {
		s := r.storedOf(&p.Message)
		if s == nil || seen[s.logical.id] {
			continue
		}
		seen[s.logical.id] = true
		if perLane[p.Message.Lane]++; perLane[p.Message.Lane] > 3 {
			continue
		}
		fmt.Fprintf(&b, "\n  %s, unacknowledged #%d: copy #%d, %d deliveries, in flight %v\n%s",
			p.Message.Lane, perLane[p.Message.Lane], s.serial, p.Deliveries, p.InFlight, r.history(s.logical))
	}
	return b.String()
}

// activity describes the consumer's backends that are not idle.
func (r *invRun) activity() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := r.admin.Query(ctx, `SELECT pid, coalesce(state, ''), coalesce(wait_event_type || ':' || wait_event, '') || ' ' || application_name, left(query, 120)
		FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, r.app)
	if err != nil {
		return fmt.Sprintf("\n  pg_stat_activity: %v", err)
	}
	var b strings.Builder
	var pid int
	var state, wait, query string
	if _, err := pgx.ForEachRow(rows, []any{&pid, &state, &wait, &query}, func() error {
		fmt.Fprintf(&b, "\n  backend %d %s %s: %s", pid, state, wait, query)
		return nil
	}); err != nil {
		fmt.Fprintf(&b, "\n  pg_stat_activity: %v", err)
	}
	return b.String()
}
