package peers

import (
	"fmt"
	"io"
	"runtime"
	"strings"
)

// QueuedShape is the name of the queued per-message shape in Shapes, which
// the target is stated for.
const QueuedShape = "queued handler"

// TargetRatio is that target: the queued shape at least this many times
// Watermill's throughput with the SHA-256 Deduplicator.
const TargetRatio = 15

// Table writes the report as Markdown: the setting, the table, and the
// target.
func (rep *Report) Table(w io.Writer) {
	o := rep.Options
	fmt.Fprintf(w, "kfake (1 broker, %d partitions), PostgreSQL %s with fsync on, %d CPUs, %s. "+
		"Every %dth message is produced a second time, %d messages later, by franz-go's kgo. "+
		"Throughput: records per second (copies included) from the first record in hand to the last settled, median of %d runs. "+
		"Crash: the first consumer is killed (SIGKILL) right after the database commit of record %d of %d and before it acknowledges it, "+
		"and a fresh consumer in the same group drains the rest.\n\n",
		o.Partitions, rep.Postgres, runtime.NumCPU(), rep.StartedAt.Format("2006-01-02"),
		o.DupEvery, o.DupLag, o.Runs, max(1, rep.Crash.Records()/3), rep.Crash.Records())
	best := rep.best()
	fmt.Fprintf(w, "| system | N (throughput) | records/s | × effectively's best | double / lost effects, no crash | double / lost effects, kill -9 after commit (N = %d) |\n", rep.Crash.Messages)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, r := range rep.Results {
		ratio := "—"
		if best > 0 {
			ratio = fmt.Sprintf("%.3g×", r.Rate/best)
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %s |\n", r.System.Name, r.Throughput.Messages, r.Rate, ratio,
			effects(r.NoCrash, r.Throughput), effects(r.Crash, rep.Crash))
	}
	fmt.Fprintln(w)
	rep.target(w)
	rep.franzTarget(w)
}

// franzTarget writes the franz-go source's throughput against the kafka-go
// source's with the same shape: the target is at least as fast.
func (rep *Report) franzTarget(w io.Writer) {
	f, k := rep.find("effectively on franz-go, "+FranzShape), rep.find("effectively, "+FranzShape)
	if f == nil || k == nil || k.Rate == 0 {
		return
	}
	fmt.Fprintf(w, "\nThe franz-go source at %.2f× the kafka-go source (%s; target ≥ 1×): %s.\n", f.Rate/k.Rate, FranzShape, mark(f.Rate >= k.Rate))
}

// effects formats what a run left, counted against w's N.
func effects(e Effects, w Workload) string {
	pct := func(n int) string {
		if n == 0 {
			return "0"
		}
		return fmt.Sprintf("%d (%.1f%%)", n, 100*float64(n)/float64(w.Messages))
	}
	return pct(e.Double) + " / " + pct(e.Lost)
}

// best returns the rate of this library's fastest shape.
func (rep *Report) best() float64 {
	var best float64
	for _, r := range rep.Results {
		if r.System.Library {
			best = max(best, r.Rate)
		}
	}
	return best
}

// find returns the result of the system whose name contains s.
func (rep *Report) find(s string) *Result {
	for _, r := range rep.Results {
		if strings.Contains(r.System.Name, s) {
			return r
		}
	}
	return nil
}

// target writes the target: the queued shape at least TargetRatio
// times Watermill with the SHA-256 Deduplicator, with no double or lost
// effect where the peers show some after the crash.
func (rep *Report) target(w io.Writer) {
	wm := rep.find("Watermill + Deduplicator, SHA-256")
	if wm == nil || wm.Rate == 0 {
		return
	}
	var parts []string
	for _, r := range rep.Results {
		if r.System.Library {
			parts = append(parts, fmt.Sprintf("%s %.1f×", strings.TrimPrefix(r.System.Name, "effectively, "), r.Rate/wm.Rate))
		}
	}
	fmt.Fprintf(w, "Against Watermill with the SHA-256 Deduplicator: %s.", strings.Join(parts, ", "))
	if q := rep.find("effectively, " + QueuedShape); q != nil {
		ok := q.Rate >= TargetRatio*wm.Rate && q.Crash == (Effects{}) && q.NoCrash == (Effects{})
		fmt.Fprintf(w, " Target (%s ≥ %d×, no double or lost effect): %s.", QueuedShape, TargetRatio, mark(ok))
	} else {
		fmt.Fprintf(w, " Target (%s ≥ %d×): not measured, the shape is not in Shapes yet.", QueuedShape, TargetRatio)
	}
	for _, r := range rep.Results {
		if r.System.Library && (r.Crash != Effects{} || r.NoCrash != Effects{}) {
			fmt.Fprintf(w, " %s left double or lost effects: INVARIANT BROKEN.", r.System.Name)
		}
	}
	fmt.Fprintln(w)
}

func mark(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
