package consumer_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pgtest"
)

// TestInvariant is the promise, for every strategy and all three handler shapes,
// over many seeds: each seed plans 50 to 100 logical messages (some 80 to
// 180 stored, with their copies) from 8 senders over 4 lanes (a sender's
// messages in one lane, like a Kafka key), with
//
//   - producer copies (the same logical message stored again: a new Ref,
//     the same key, sender and seq, and value) later in the lane, mostly
//     soon after the original;
//   - binary refs (differing only in NUL or invalid UTF-8 bytes) and
//     recurring refs (a lane that restarts its offsets at 0);
//   - nil and empty values;
//   - handler failures: transient ones (a good message fails one or two
//     deliveries, of any of its copies), poison that fails permanently or
//     every time, and
//     poison whose row breaks a deferred foreign key, so that its COMMIT
//     fails; and messages with no usable key;
//   - connections terminated by pg_terminate_backend from an admin
//     connection: mid-handler, aimed at a COMMIT, and the whole pool at
//     random moments; and connections lost right after COMMIT was sent, so
//     that the consumer cannot know it committed;
//   - crashes mid-handler and between commit and ack (lost acks), broker
//     duplicates, and consumer restarts;
//
// and then checks the ledger (see check): exactly one effect per good
// logical message, exactly the poison messages parked, nothing else.
//
// INVARIANT_SEEDS sets the number of seeds per configuration (default 20;
// `make soak` runs more), INVARIANT_PARALLEL how many runs go at once
// (default 4). INVARIANT_OFF, a comma-separated list of generator features
// (see invFeatures), turns them off, to tell one failure mode from another.
// A failing run prints its seed and the command that replays it.
func TestInvariant(t *testing.T) {
	t.Parallel()
	seeds := envInt(t, "INVARIANT_SEEDS", 20)
	sem := make(chan struct{}, envInt(t, "INVARIANT_PARALLEL", 4))
	opts, off := invOptions(t)
	var wg sync.WaitGroup
	for _, strat := range invStrategies {
		wg.Go(func() {
			t.Run(strat.name, func(t *testing.T) {
				var wg sync.WaitGroup
				for _, shape := range []string{"Handler", "QueueHandler", "BatchHandler"} {
					wg.Go(func() {
						t.Run(shape, func(t *testing.T) {
							url := pgtest.URL(t) // one database for the configuration, a schema per seed
							var total invStats
							ran := 0
							for seed := 1; seed <= seeds; seed++ {
								t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
									sem <- struct{}{}
									defer func() { <-sem }()
									ran++
									total.add(runInvariantSeed(t, url, uint64(seed), opts, strat, shape))
								})
							}
							t.Logf("%d seeds: %s", ran, total)
							if ran >= 10 {
								checkExercised(t, total, off)
							}
						})
					})
				}
				wg.Wait()
			})
		})
	}
	wg.Wait()
}

// runInvariantSeed is one run.
func runInvariantSeed(t *testing.T, url string, seed uint64, opts planOptions, strat invStrategy, shape string) invStats {
	p := newPlan(seed, opts)
	t.Cleanup(func() {
		if t.Failed() {
			env := ""
			if seed > 20 {
				env = fmt.Sprintf("INVARIANT_SEEDS=%d ", seed)
			}
			if v := os.Getenv("INVARIANT_OFF"); v != "" {
				env += fmt.Sprintf("INVARIANT_OFF=%s ", v)
			}
			t.Logf("FAILED with seed %d; replay: %sgo test -race -count=1 -run '^TestInvariant$/^%s$/^%s$/^seed=%d$' ./consumer/",
				seed, env, strat.name, shape, seed)
		}
	})
	t.Log(p)
	r := newInvRun(t, url, p, strat, shape)
	start := time.Now()
	stuck := r.consume()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.settleCommitKills(ctx)
	t.Logf("done in %v: %s", time.Since(start).Round(time.Millisecond), r.stats)
	if stuck != "" {
		t.Errorf("seed %d: %s; %s", seed, stuck, r.stuckReport())
	}
	reportProblems(t, seed, r.check(ctx))
	return r.stats
}

// reportProblems fails t with a count of the problems by kind, then the
// first few of each kind, most serious first.
func reportProblems(t *testing.T, seed uint64, problems []problem) {
	if len(problems) == 0 {
		return
	}
	byKind := map[string][]problem{}
	for _, p := range problems {
		byKind[p.kind] = append(byKind[p.kind], p)
	}
	var counts []string
	for _, k := range problemKinds {
		if n := len(byKind[k]); n > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", n, k))
		}
	}
	t.Errorf("seed %d: %d problems: %s", seed, len(problems), strings.Join(counts, ", "))
	shown := 0
	for _, k := range problemKinds {
		for i, p := range byKind[k] {
			if i == 2 || shown == 8 {
				break
			}
			t.Errorf("seed %d: %s", seed, p.msg)
			shown++
		}
	}
}

// checkExercised fails if a configuration's runs, together, did not see
// each fault they were meant to: a test that cannot fail tests nothing.
func checkExercised(t *testing.T, s invStats, off map[string]bool) {
	t.Helper()
	for _, c := range []struct {
		feature string
		n       int
	}{
		{"restarts", s.lifetimes - 1},
		{"kill-handler", s.killHandler},
		{"kill-commit", s.killCommit},
		{"drop-commit", s.dropCommit},
		{"lost-commit-landed", s.commitKilledButCommitted},
		{"kill-all", s.killAll},
		{"crash", s.crash},
		{"lost-acks", s.broker.LostAcks},
		{"parked", s.totals.Parked},
		{"duplicates", s.totals.Duplicate},
		{"isolated", s.totals.Isolated},
	} {
		if !off[c.feature] && c.n == 0 {
			t.Errorf("no %s in any run: the generator did not exercise it", c.feature)
		}
	}
}

// invFeatures are the generator's features INVARIANT_OFF can turn off.
var invFeatures = map[string]func(*planOptions){
	"copies":           func(o *planOptions) { o.noCopies = true },
	"binary-refs":      func(o *planOptions) { o.noBinaryRefs = true },
	"recurring-refs":   func(o *planOptions) { o.noRecurringRefs = true },
	"nil":              func(o *planOptions) { o.noNil = true },
	"retryable":        func(o *planOptions) { o.noRetryable = true },
	"poison-permanent": func(o *planOptions) { o.noPoisonPermanent = true },
	"poison-exhaust":   func(o *planOptions) { o.noPoisonExhaust = true },
	"poison-commit":    func(o *planOptions) { o.noPoisonCommit = true },
	"poison-key":       func(o *planOptions) { o.noPoisonKey = true },
	"kill-handler":     func(o *planOptions) { o.noKillHandler = true },
	"kill-commit":      func(o *planOptions) { o.noKillCommit = true },
	"drop-commit":      func(o *planOptions) { o.noDropCommit = true },
	"kill-all":         func(o *planOptions) { o.noKillAll = true },
	"crash":            func(o *planOptions) { o.noCrash = true },
	"lost-acks":        func(o *planOptions) { o.noLostAcks = true },
	"restarts":         func(o *planOptions) { o.noRestarts = true },
}

func invOptions(t *testing.T) (planOptions, map[string]bool) {
	var o planOptions
	off := map[string]bool{}
	for _, f := range strings.Split(os.Getenv("INVARIANT_OFF"), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		set, ok := invFeatures[f]
		if !ok {
			t.Fatalf("INVARIANT_OFF: unknown feature %q", f)
		}
		set(&o)
		off[f] = true
	}
	if off["drop-commit"] {
		off["lost-commit-landed"] = true // only a drop makes it certain
	}
	if off["poison-permanent"] && off["poison-exhaust"] && off["poison-commit"] && off["poison-key"] {
		off["parked"] = true
	}
	return o, off
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}
