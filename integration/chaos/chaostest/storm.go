package chaostest

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/integration/chaos"
)

// stormPlan is what Storm measures: a backlog of messages consumed by
// workers, once calm and once under a kill storm.
type stormPlan struct {
	messages, workers, kills int
	every                    time.Duration // between kills
	runs                     int
}

// window is the span both phases measure: kills × every.
func (p stormPlan) window() time.Duration { return time.Duration(p.kills) * p.every }

func stormPlanFromEnv(t *testing.T) stormPlan {
	p := stormPlan{messages: 1_500_000, workers: 3, kills: 8, every: 2 * time.Second, runs: 1}
	atoi := func(name string, dst *int) {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", name, v)
			}
			*dst = n
		}
	}
	atoi("CHAOS_STORM_MESSAGES", &p.messages)
	atoi("CHAOS_STORM_WORKERS", &p.workers)
	atoi("CHAOS_STORM_KILLS", &p.kills)
	atoi("CHAOS_STORM_RUNS", &p.runs)
	if v := os.Getenv("CHAOS_STORM_EVERY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("CHAOS_STORM_EVERY=%q: want a positive duration", v)
		}
		p.every = d
	}
	p.workers = max(p.workers, 2)
	return p
}

// Storm measures what kills cost: the throughput of a kill storm as a
// share of the same run's calm throughput, in one command. Each run has
// two phases, each on a fresh broker and database: a backlog of messages
// (producer duplicates and poison messages as in Run) is produced, the
// workers start, and once every partition was consumed from, the
// throughput (effect rows per second) is measured over a window of
// kills × every. The calm phase kills nobody; the storm phase SIGKILLs a
// random worker every interval, in the middle of it, and starts its
// replacement in its slot (with static membership, under its instance ID)
// as Run does. The backlog must outlast the window in every partition, or
// the measurement is refused. After the window each phase consumes the
// rest and runs Run's checks (exactly one effect per logical message,
// poison parked, offsets never backwards, stalls within stallBound). It
// prints each phase's rate and the ratio, and with several runs the
// medians.
//
// It is a measurement, run only with CHAOS_STORM=1. Environment:
// CHAOS_STORM_MESSAGES (1,500,000), CHAOS_STORM_WORKERS (3),
// CHAOS_STORM_KILLS (8), CHAOS_STORM_EVERY (2s), CHAOS_STORM_RUNS (1);
// CHAOS_STATIC=0 makes the workers dynamic members; CHAOS_SEED,
// CHAOS_LOGS and CHAOS_WORKER_RACE as for Run.
func Storm(t *testing.T, h Harness) {
	if os.Getenv("CHAOS_STORM") != "1" {
		t.Skip("a throughput measurement: run with CHAOS_STORM=1")
	}
	if h.Worker == "" {
		t.Fatal("chaostest: Harness.Worker is required")
	}
	sp := stormPlanFromEnv(t)
	t.Logf("storm: %d messages as a backlog, %d workers, window %s; storm: %d kills, one every %s; %d runs",
		sp.messages, sp.workers, sp.window(), sp.kills, sp.every, sp.runs)
	var calm, storm, ratios []float64
	for i := range sp.runs {
		var c, s float64
		t.Run(fmt.Sprintf("run%d/calm", i+1), func(t *testing.T) { c = stormPhase(t, h, sp, 0) })
		t.Run(fmt.Sprintf("run%d/storm", i+1), func(t *testing.T) { s = stormPhase(t, h, sp, sp.kills) })
		if c <= 0 || s <= 0 {
			t.Fatalf("run %d: a phase measured nothing (calm %.0f, storm %.0f msgs/s)", i+1, c, s)
		}
		calm, storm, ratios = append(calm, c), append(storm, s), append(ratios, s/c)
		t.Logf("run %d: calm %.0f msgs/s, storm %.0f msgs/s: %.0f%%", i+1, c, s, 100*s/c)
	}
	all := make([]string, len(ratios))
	for i := range ratios {
		all[i] = fmt.Sprintf("%.0f/%.0f = %.0f%%", storm[i], calm[i], 100*ratios[i])
	}
	t.Logf("kill storm (%d kills, one every %s, %d workers, instance IDs given %v): median calm %.0f msgs/s, median storm %.0f msgs/s, median ratio %.0f%% (runs: %s)",
		sp.kills, sp.every, sp.workers, staticFromEnv(), median(calm), median(storm), 100*median(ratios), strings.Join(all, ", "))
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// stormPhase runs one phase with kills kills and returns its throughput
// over the window, in effect rows per second.
func stormPhase(t *testing.T, h Harness, sp stormPlan, kills int) float64 {
	seed := time.Now().UnixNano() % 1_000_000
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: want a number", v)
		}
		seed = n
	}
	pl := plan{
		messages: sp.messages, backlog: sp.messages, workers: sp.workers, kills: kills,
		dupRate: 0.05, poisonRate: 0.002, seed: seed, deadline: 15 * time.Minute,
	}
	r := newRun(t, pl, h, staticFromEnv())
	rate := r.stormExecute(sp)
	r.check()
	return rate
}

// stormExecute produces the whole backlog, starts the workers, measures
// the window (killing a worker every sp.every in the middle of each
// interval when the plan has kills), then lets the workers consume the
// rest.
func (r *run) stormExecute(sp stormPlan) float64 {
	t := r.t
	go r.prod.run(r.ctx, t.Logf)
	r.prod.flushTo(r.pl.messages)
	r.waitFor("the backlog to be produced", r.prod.done)

	r.begin = time.Now()
	stopSampler := r.startSampler()
	for i := range r.pl.workers {
		r.startWorker(i + 1)
	}
	r.waitFirstConsumed()
	from := time.Now()
	to := from.Add(sp.window())
	for i := range r.pl.kills {
		sleepUntil(from.Add(time.Duration(i)*sp.every + sp.every/2))
		r.checkCrashes()
		r.kill()
	}
	sleepUntil(to)
	ends, pos := r.prod.endsSnapshot(), r.samp.positions()
	var drained []string
	for k, e := range ends {
		if pos[k] >= e {
			drained = append(drained, k.String())
		}
	}
	r.wrapUp(stopSampler)
	var n int
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*) FROM `+chaos.EffectsTable+` WHERE at >= $1 AND at < $2`, from, to).Scan(&n); err != nil {
		t.Fatalf("count the window's effects: %v", err)
	}
	if len(drained) > 0 {
		slices.Sort(drained)
		t.Fatalf("partitions %s were consumed to their end within the %s window (%d effects in it): the rate would count idle time; raise CHAOS_STORM_MESSAGES",
			strings.Join(drained, " "), sp.window(), n)
	}
	rate := float64(n) / sp.window().Seconds()
	t.Logf("%d kills: %d effects in the %s window: %.0f msgs/s", r.pl.kills, n, sp.window(), rate)
	return rate
}

func sleepUntil(at time.Time) {
	if d := time.Until(at); d > 0 {
		time.Sleep(d) // pacing the events, not waiting for one
	}
}
