package chaostest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/integration/chaos"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

const (
	group    = "chaos"
	topicA   = "chaos-a" // 4 partitions, 6 after the partitions are added
	topicB   = "chaos-b" // 4 partitions
	topicNew = "chaos-new"
	// partitions of each topic
	partsA, partsAAfter, partsB, partsNew = 4, 6, 4, 3
)

// event is one thing the driver did to the group.
type event struct {
	kind   string // kill, freeze, thaw, new-topic, add-partitions
	detail string
	at     time.Time
	// noTx is set on a freeze that found no transaction of the worker to
	// freeze in.
	noTx bool
}

// Harness names the source a chaos run breaks.
type Harness struct {
	// Worker is the import path of the worker program: a main package
	// that calls worker.Main (package integration/chaos/worker) with its
	// source. It is built with the go command from the test's directory,
	// so it must be in the test's module or its requirements. Required.
	Worker string
	// StaticMembership says that the worker's source has static group
	// membership (KIP-345; sources/franz): given an instance ID, a killed
	// worker's replacement takes the dead member's place without a
	// rebalance. Sources without it (sources/kafka) ignore the ID and
	// rebalance on every kill.
	StaticMembership bool
}

// BrokerPackage is the broker program every run uses: kfake in a process
// of its own.
const BrokerPackage = "github.com/effectively-once/effectively/integration/chaos/cmd/broker"

// Run runs a Kafka source as production does: a broker process, several
// worker processes of h.Worker, and the test as the driver. While the
// messages flow it kills workers (SIGKILL), freezes one in the middle of a
// batch transaction (SIGSTOP for longer than stallBound, then SIGCONT),
// starts replacements,
// creates a topic the workers are configured to consume and adds
// partitions to another. Then it checks exactly one effect per logical
// message, exactly the poison messages parked, stored offsets that never
// went backwards, and stalls within stallBound (topologyBound for the new
// partitions). The test's package must run pgtest.Main in its TestMain.
//
// Environment: CHAOS_FULL=1 for the long run (120,000 messages, 12 kills,
// 2 freezes, 4 workers); CHAOS_MESSAGES, CHAOS_KILLS, CHAOS_FREEZES,
// CHAOS_WORKERS override the plan; CHAOS_SEED repeats a run's choices;
// CHAOS_TOPOLOGY=0 leaves out the topic and partition changes;
// CHAOS_WORKER_RACE=1 builds the workers with the race detector;
// CHAOS_LOGS=dir keeps the processes' logs there.
func Run(t *testing.T, h Harness) {
	if testing.Short() {
		t.Skip("multi-process chaos run: skipped with -short")
	}
	if h.Worker == "" {
		t.Fatal("chaostest: Harness.Worker is required")
	}
	pl := planFromEnv(t)
	r := newRun(t, pl, h, staticFromEnv())
	r.execute()
	r.check()
}

// run is one chaos run.
type run struct {
	t       *testing.T
	pl      plan
	rng     *rand.Rand
	ctx     context.Context
	logDir  string
	dbURL   string
	pool    *pgxpool.Pool
	broker  string
	admin   *kafkago.Client
	worker  string // binary
	topics  []string
	prod    *producer
	samp    *sampler
	begin   time.Time
	end     time.Time
	events  []event
	workers []*proc // every worker started
	live    []*proc // started, not killed
	nextW   int
	// slotOf is each worker's slot: a killed or crashed worker's
	// replacement takes its slot, and with static membership its
	// instance ID (instanceID).
	slotOf    map[*proc]int
	freeSlots []int
	static    bool // workers join as static members (see staticFromEnv)
	// staticSource: the source honours the instance IDs
	// (Harness.StaticMembership).
	staticSource bool
	crashes      []string
	// when the topology changed, and the lanes it added
	newTopicAt, addedAt time.Time
	newLanes, addLanes  []laneKey
	initialLanes        []laneKey        // the partitions when the workers start
	lockWaits           map[int][]string // by freeze event: statements seen waiting for the frozen worker
}

// staticFromEnv says whether the workers join as static members, the
// configuration that hands a restarted worker its partitions back without
// a rebalance: yes, unless CHAOS_STATIC=0.
func staticFromEnv() bool { return os.Getenv("CHAOS_STATIC") != "0" }

func newRun(t *testing.T, pl plan, h Harness, static bool) *run {
	ctx, cancel := context.WithTimeout(context.Background(), pl.deadline)
	t.Cleanup(cancel)
	r := &run{t: t, pl: pl, rng: rand.New(rand.NewPCG(uint64(pl.seed), 2)), ctx: ctx,
		slotOf: map[*proc]int{}, static: static, staticSource: h.StaticMembership}
	r.logDir = os.Getenv("CHAOS_LOGS")
	if r.logDir == "" {
		r.logDir = t.TempDir()
	} else if err := os.MkdirAll(r.logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("plan: %d messages (%d as a backlog), %d workers (static members %v), %d kills, %d freezes of %s, topology changes %v, seed %d (CHAOS_SEED); logs in %s",
		pl.messages, pl.backlog, pl.workers, r.static, pl.kills, pl.freezes, freezeFor(timing), pl.topology, pl.seed, r.logDir)

	brokerBin, workerBin := buildBinaries(t, t.TempDir(), h.Worker, os.Getenv("CHAOS_WORKER_RACE") == "1")
	r.worker = workerBin

	r.dbURL = pgtest.URL(t)
	pool, err := pgxpool.New(ctx, r.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r.pool = pool
	if _, err := pool.Exec(ctx, chaos.EffectsDDL); err != nil {
		t.Fatal(err)
	}

	_, r.broker = startBroker(t, brokerBin, r.logDir, timing.session)
	r.admin = &kafkago.Client{Addr: kafkago.TCP(r.broker), Timeout: 30 * time.Second, Transport: &kafkago.Transport{}}
	t.Cleanup(func() { r.admin.Transport.(*kafkago.Transport).CloseIdleConnections() })
	r.createTopic(topicA, partsA)
	r.createTopic(topicB, partsB)
	r.topics = []string{topicA, topicB}
	if pl.topology {
		r.topics = append(r.topics, topicNew) // configured before it exists
	}

	var lanes []laneKey
	for p := range partsA {
		lanes = append(lanes, laneKey{topicA, int32(p)})
	}
	for p := range partsB {
		lanes = append(lanes, laneKey{topicB, int32(p)})
	}
	r.initialLanes = lanes
	r.prod, err = newProducer([]string{r.broker}, pl, lanes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.prod.close)
	r.samp = newSampler(pool, group, r.prod)
	return r
}

func (r *run) createTopic(topic string, partitions int) {
	r.t.Helper()
	resp, err := r.admin.CreateTopics(r.ctx, &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		r.t.Fatalf("create topic %s: %v", topic, err)
	}
}

func (r *run) since(at time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return fmt.Sprintf("+%.1fs", at.Sub(r.begin).Seconds())
}

// instanceID is the static group instance ID of the workers of slot.
func instanceID(slot int) string { return fmt.Sprintf("chaos-slot-%d", slot) }

// startWorker starts one more worker in slot (0: a slot freed by a crash,
// else a new one) and waits until it is ready; a worker that cannot start
// fails the test at once. With static membership it joins with the slot's
// instance ID, so that it takes the place of the slot's previous worker.
func (r *run) startWorker(slot int) *proc {
	r.t.Helper()
	if slot == 0 && len(r.freeSlots) > 0 {
		slot, r.freeSlots = r.freeSlots[0], r.freeSlots[1:]
	}
	if slot == 0 {
		taken := map[int]bool{}
		for _, s := range r.slotOf {
			taken[s] = true
		}
		for slot = 1; taken[slot]; slot++ {
		}
	}
	r.nextW++
	name := fmt.Sprintf("w%d", r.nextW)
	args := []string{"-brokers", r.broker, "-db", r.dbURL, "-group", group, "-topics", strings.Join(r.topics, ","),
		"-name", name, "-session-timeout", timing.session.String(),
		"-heartbeat-interval", timing.heartbeat.String(), "-rebalance-timeout", timing.rebalance.String(),
		"-exit-with-stdin"}
	if r.static {
		args = append(args, "-instance-id", instanceID(slot))
	}
	p, _, err := startProc(r.t, name, r.logDir, 2*time.Minute, r.worker, args...)
	if err != nil {
		r.t.Fatalf("worker %s: %v", name, err)
	}
	r.workers = append(r.workers, p)
	r.live = append(r.live, p)
	r.slotOf[p] = slot
	return p
}

// schedule returns the order of the chaos events.
func (r *run) schedule() []string {
	var ops []string
	for range r.pl.kills {
		ops = append(ops, "kill")
	}
	for range r.pl.freezes {
		ops = append(ops, "freeze")
	}
	r.rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	if r.pl.topology {
		at := func(i int, op string) { ops = append(ops[:i], append([]string{op}, ops[i:]...)...) }
		at(len(ops)/3, "new-topic")
		at(2*len(ops)/3+1, "add-partitions")
	}
	return ops
}

// execute runs the plan: backlog, workers, paced production with the
// chaos events, then waits until everything is consumed.
func (r *run) execute() {
	t := r.t
	pl := r.pl
	go r.prod.run(r.ctx, t.Logf)
	r.prod.flushTo(pl.backlog)
	r.waitFor("the backlog to be produced", func() bool { l, _, _ := r.prod.status(); return l >= pl.backlog })

	r.begin = time.Now()
	stopSampler := r.startSampler()
	for i := range pl.workers {
		r.startWorker(i + 1)
	}
	ops := r.schedule()
	// Pace the rest so that it flows through every step, each step's share
	// by its expected length; a tenth is kept for the end, unpaced.
	est := func(op string) time.Duration {
		switch op {
		case "kill":
			return 9 * time.Second
		case "freeze":
			return freezeFor(timing) + 9*time.Second
		}
		return 6 * time.Second
	}
	steps := append([]string{"start"}, ops...)
	var total time.Duration
	for _, op := range steps {
		total += est(op)
	}
	reserve := pl.messages / 10
	paced := float64(pl.messages - pl.backlog - reserve)
	target := float64(pl.backlog)
	pace := func(op string) {
		target += paced * est(op).Seconds() / total.Seconds()
		logical, _, _ := r.prod.status()
		const floor = 20 // messages/s: every step has some flow
		r.prod.setRate(max(floor, (target-float64(logical))/est(op).Seconds()), pl.messages-reserve)
	}
	t.Logf("events: %s; producing about %.0f messages/s for about %s", strings.Join(ops, ", "), paced/total.Seconds(), total)

	pace("start")
	r.waitFirstConsumed()
	for _, op := range ops {
		pace(op)
		switch op {
		case "kill":
			r.kill()
		case "freeze":
			r.freeze()
		case "new-topic":
			r.newTopic()
		case "add-partitions":
			r.addPartitions()
		}
		var fresh []laneKey
		var newGenAfter time.Time
		switch op {
		case "new-topic":
			fresh = r.newLanes
		case "add-partitions":
			fresh = r.addLanes
		case "kill":
			// A killed worker's replacement takes its partitions. A
			// dynamic member's does so in a rebalance, a new generation
			// to wait for; a static member's takes the killed member's
			// place in the generation it had (KIP-345), so no newer one
			// comes, and waiting for one would only run out the bound
			// (and the producer's pace with it).
			if !r.static || !r.staticSource {
				newGenAfter = r.events[len(r.events)-1].at
			}
		default: // a freeze outlasts the session: the rebalances it causes
			newGenAfter = r.events[len(r.events)-1].at
		}
		r.waitStable("the group to recover from "+op, 2*time.Second+time.Duration(r.rng.IntN(2000))*time.Millisecond, fresh, newGenAfter)
	}

	r.prod.flushTo(pl.messages)
	r.waitFor("the producer to finish", r.prod.done)
	r.wrapUp(stopSampler)
}

// startSampler runs the sampler until the returned function stops it,
// which then takes a last sample and closes the series.
func (r *run) startSampler() (stop func()) {
	ctx, cancel := context.WithCancel(r.ctx)
	sampled := make(chan struct{})
	go func() { defer close(sampled); r.samp.run(ctx) }()
	return func() {
		cancel()
		<-sampled
		r.samp.sample(r.ctx)
		r.samp.finish()
	}
}

// wrapUp ends a run or a phase once every message was consumed: the
// sampler's last sample, the end time, and every worker killed, those that
// had exited on their own recorded as crashes.
func (r *run) wrapUp(stopSampler func()) {
	r.waitCaughtUp()
	stopSampler()
	r.end = time.Now()
	for _, p := range r.workers {
		if msg := p.unexpectedExit(); msg != "" {
			r.crashes = append(r.crashes, msg)
		}
		p.kill()
	}
}

// checkCrashes records workers that exited without being killed and
// replaces them, so that the run goes on and reports everything.
func (r *run) checkCrashes() {
	kept := r.live[:0]
	for _, p := range r.live {
		if msg := p.unexpectedExit(); msg != "" {
			r.crashes = append(r.crashes, msg)
			r.t.Logf("worker crashed: %s", msg)
			p.kill() // marks it expected, so it is reported once
			r.freeSlots = append(r.freeSlots, r.slotOf[p])
			delete(r.slotOf, p)
			continue
		}
		kept = append(kept, p)
	}
	r.live = kept
	for len(r.live) < r.pl.workers && r.ctx.Err() == nil {
		r.startWorker(0)
	}
}
