package expiry

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Targets are the goals the Markdown table reports as met or missed.
const (
	// TargetClaimRatio: bloom's claim throughput at least idset's.
	TargetClaimRatio = 1.0
	// TargetExpiryFactor: expiring a slice at least this many times
	// cheaper in wall time and in WAL.
	TargetExpiryFactor = 50.0
	// TargetDuring: claim throughput while a slice expires at least this
	// share of the steady state.
	TargetDuring = 0.9
	// TargetFPFactor: measured false-positive rate at most this many
	// times the configured one.
	TargetFPFactor = 1.5
	// TargetBytesPerKey: sealed filter memory per key (set at a 1% target,
	// 1.20 B; at the default 0.5%, 1.38 B).
	TargetBytesPerKey = 1.5
)

// Checks returns each target's name, measured value and whether it is met.
func (r *Result) Checks() []Check {
	timeFactor := r.Idset.Expiry.Took.Seconds() / r.Bloom.Expiry.Took.Seconds()
	walFactor := float64(r.Idset.Expiry.WALBytes) / float64(max(r.Bloom.Expiry.WALBytes, 1))
	return []Check{
		{"claim throughput ≥ idset's", fmt.Sprintf("%.2f×", r.ClaimRatio), r.ClaimRatio >= TargetClaimRatio},
		{"expiry ≥ 50× cheaper in time", fmt.Sprintf("%s×", group(timeFactor)), timeFactor >= TargetExpiryFactor},
		{"expiry ≥ 50× cheaper in WAL", fmt.Sprintf("%s×", group(walFactor)), walFactor >= TargetExpiryFactor},
		{"throughput during expiry ≥ 90% of steady state", fmt.Sprintf("%.0f%%", 100*r.Bloom.During.Ratio()), r.Bloom.During.Ratio() >= TargetDuring},
		{"false-positive rate ≤ 1.5× target", fmt.Sprintf("%.2f%%", 100*r.Filter.Rate), r.Filter.Tests > 0 && r.Filter.Rate <= TargetFPFactor*r.Filter.Target},
		{"≤ 1.5 bytes of filter per key", fmt.Sprintf("%.2f B", r.Filter.BytesPerKey()), r.Filter.BytesPerKey() <= TargetBytesPerKey},
	}
}

// Check is one target.
type Check struct {
	Target, Value string
	Met           bool
}

// Markdown writes the result as the table BENCHMARKS.md shows, followed by
// the targets.
func (r *Result) Markdown(w io.Writer) {
	c := r.Config
	b, i := r.Bloom, r.Idset
	fmt.Fprintf(w, "PostgreSQL %s, fsync on; %s live markers per strategy over a retention of %d daily slices (%s per slice); fresh traffic, %d new keys per transaction; throughput is the median of %d interleaved runs of %s keys; bloom's filter of the current slice is sized for %s keys (%s were claimed into it).\n\n",
		r.Server, group(float64(c.Markers)), c.Slices, group(float64(r.PerSlice)), c.Batch, c.Runs, group(float64(c.ClaimKeys)),
		group(float64(c.CurrentKeys)), group(float64(b.Claimed)))
	fmt.Fprintln(w, "| measure | bloom | idset | bloom vs idset |")
	fmt.Fprintln(w, "|---|---:|---:|---:|")
	fmt.Fprintf(w, "| (a) claim throughput, keys/s (median of runs; ratio: median of the runs' ratios) | %s | %s | %.2f× |\n", group(b.Rate), group(i.Rate), r.ClaimRatio)
	fmt.Fprintf(w, "| (b) expiring one slice (%s markers), alone: wall time | %s | %s | %s |\n",
		group(float64(r.PerSlice)), dur(b.Expiry.Took), dur(i.Expiry.Took), cheaper(i.Expiry.Took.Seconds()/b.Expiry.Took.Seconds()))
	fmt.Fprintf(w, "| (b) expiring one slice, alone: WAL written | %s | %s | %s |\n",
		bytes(b.Expiry.WALBytes), bytes(i.Expiry.WALBytes), cheaper(float64(i.Expiry.WALBytes)/float64(max(b.Expiry.WALBytes, 1))))
	fmt.Fprintf(w, "| (c) steady claim throughput around the next slice's expiry, keys/s | %s | %s | |\n", group(b.During.Steady), group(i.During.Steady))
	fmt.Fprintf(w, "| (c) claim throughput while it expires, keys/s (window) | %s (%s) | %s (%s) | |\n",
		group(b.During.During), dur(b.During.Window), group(i.During.During), dur(i.During.Window))
	var each []string
	for _, d := range b.DuringRuns {
		each = append(each, fmt.Sprintf("%.0f%%", 100*d.Ratio()))
	}
	fmt.Fprintf(w, "| (c) … as a share of the strategy's steady state | **%.0f%%** (median of %d drops: %s) | **%.0f%%** | |\n",
		100*b.During.Ratio(), len(b.DuringRuns), strings.Join(each, ", "), 100*i.During.Ratio())
	fmt.Fprintf(w, "| (c) longest claim: steady / during the expiry | %s / %s | %s / %s | |\n",
		dur(b.During.SteadyWorst), dur(b.During.DuringWorst), dur(i.During.SteadyWorst), dur(i.During.DuringWorst))
	fmt.Fprintf(w, "| (c) the expiry under claims: wall time | %s | %s | |\n", dur(b.During.Expiry.Took), dur(i.During.Expiry.Took))
	fmt.Fprintf(w, "| (d) filter memory per key (sealed filters, %s keys) | %.2f B | — | |\n", group(float64(r.Filter.SealedKeys)), r.Filter.BytesPerKey())
	fmt.Fprintf(w, "| (d) measured false-positive rate (target %.2g%%) | %.2f%% (%s of %s tests) | — | |\n",
		100*r.Filter.Target, 100*r.Filter.Rate, group(float64(r.Filter.FalsePositives)), group(float64(r.Filter.Tests)))
	fmt.Fprintf(w, "| partition probes per new key | %.3f | — | |\n", r.Filter.ProbesPerKey)
	fmt.Fprintf(w, "| loading both tables side by side + VACUUM ANALYZE; bloom Maintain + Warm | %s; %s | | |\n", dur(r.Load), dur(r.Warm))
	fmt.Fprintln(w)
	var runs []string
	for k := range b.Rates {
		runs = append(runs, fmt.Sprintf("%s / %s (%.2f×)", group(b.Rates[k]), group(i.Rates[k]), r.ClaimRatios[k]))
	}
	fmt.Fprintf(w, "Claim runs in order, bloom / idset keys/s: %s.\n\n", strings.Join(runs, "; "))
	var parts []string
	for _, ch := range r.Checks() {
		mark := "met"
		if !ch.Met {
			mark = "**MISSED**"
		}
		parts = append(parts, fmt.Sprintf("%s: %s (%s)", ch.Target, ch.Value, mark))
	}
	fmt.Fprintf(w, "Targets: %s.\n", strings.Join(parts, "; "))
}

// cheaper says how many times cheaper bloom is, given idset's cost over
// bloom's.
func cheaper(f float64) string {
	if f >= 1 {
		return group(f) + "× cheaper"
	}
	return group(1/f) + "× dearer"
}

// group formats x rounded, with thousands separators; below 10 with two
// decimals.
func group(x float64) string {
	if x < 10 {
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	s := strconv.FormatInt(int64(x+0.5), 10)
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	return b.String()
}

func dur(d time.Duration) string {
	switch {
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
}

func bytes(n int64) string {
	switch {
	case n < 10_000:
		return fmt.Sprintf("%d B", n)
	case n < 10_000_000:
		return fmt.Sprintf("%.1f KB", float64(n)/1e3)
	default:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
}
