package chaostest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/chaos"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// plan is what one chaos run does.
type plan struct {
	messages   int     // logical messages
	backlog    int     // of them, produced before the first worker starts
	workers    int     // workers alive at any time (a killed one is replaced)
	kills      int     // SIGKILLs of a random worker
	freezes    int     // SIGSTOPs of a random worker for longer than stallBound
	topology   bool    // create a topic the workers consume, add partitions to another
	dupRate    float64 // share of logical messages the producer sends twice
	poisonRate float64 // share of logical messages the handler rejects permanently
	seed       int64
	deadline   time.Duration // for the whole run; waits are progress-based within it
}

// groupTiming is the consumer group configuration of every worker:
// explicit and short, so that a run takes a minute or two.
type groupTiming struct {
	session, heartbeat, rebalance time.Duration
}

var timing = groupTiming{
	session:   6 * time.Second, // the smallest a Kafka broker accepts by default
	heartbeat: 500 * time.Millisecond,
	rebalance: 10 * time.Second,
}

// stallBound is the longest a partition may have messages waiting without
// its position moving, after a worker is killed or frozen (or resumes),
// for a group configured with t. The Kafka source documents it as a
// function of its Config; keep the two in step:
//
//   - a dead or frozen member is noticed when its session expires,
//     SessionTimeout after its last heartbeat;
//   - the rebalance that follows waits at most RebalanceTimeout for the
//     live members to rejoin (they notice within a HeartbeatInterval);
//   - the partition's new owner then claims it in Postgres, seeks and
//     commits its first batch.
//
// A kill that lands during a rebalance, while the victim's JoinGroup waits
// in the coordinator, takes the same terms in the other order: the join
// phase completes counting the dead member in (at most RebalanceTimeout
// after the rebalance began, which revoked the partitions it is then
// assigned), the coordinator schedules its session expiry at that
// completion, and SessionTimeout later the rebalance that drops it runs
// with live members only (a heartbeat to notice, their in-flight batches,
// the claim). So SessionTimeout + RebalanceTimeout + heartbeats bounds it
// too. That is Kafka's rule; kfake on its own never expired such a
// member (see package internal/kafkatest, whose session keeper the
// runs' broker has), and the partitions stalled until the next kill.
//
// The slack covers that last step and the sampler's resolution on machines
// 2-3x slower than an idle development machine. A frozen member must not
// lengthen any of this: its session expires like a dead one's, and its open
// transaction must not hold up the new owner.
//
// Each membership change starts that recovery afresh: a kill while the
// group still recovers from the last one (a kill storm, see Storm) is a
// kill during a rebalance, bounded as above from the later kill. So the
// bound holds from the last kill or freeze before the stall ended (see
// stallExcess), not from the first; a thaw restarts nothing.
//
// Static members (a worker's replacement joins with its instance ID) make
// a kill cost less, not more: the replacement takes the dead member's
// place as soon as it joins, in a rebalance the live members join within
// a heartbeat, without the session timeout; the bound above stays an
// upper bound and is not tightened, since a replacement may take longer
// to start than the session takes to expire on a loaded machine.
func stallBound(t groupTiming) time.Duration {
	const slack = 6 * time.Second
	return t.session + t.rebalance + 4*t.heartbeat + slack
}

// topologyBound is the longest after a topic the workers are configured
// to consume is created, or partitions are added to one, until the new
// partitions' first records are consumed: the group notices the change
// (kafka-go's partition watch polls every 5s by default, and the Kafka
// source may choose its own interval), rebalances, and the new owners claim.
func topologyBound(t groupTiming) time.Duration {
	const watch = 10 * time.Second
	return watch + stallBound(t)
}

// freezeFor is how long a frozen worker stays stopped: longer than
// stallBound, so that a group that waits for it to resume cannot pass.
func freezeFor(t groupTiming) time.Duration { return stallBound(t) + 2*time.Second }

func planFromEnv(t *testing.T) plan {
	p := plan{
		messages: 20_000, backlog: 5_000, workers: 3, kills: 3, freezes: 1, topology: true,
		dupRate: 0.05, poisonRate: 0.002, seed: time.Now().UnixNano() % 1_000_000, deadline: 6 * time.Minute,
	}
	if os.Getenv("CHAOS_FULL") == "1" {
		p.messages, p.backlog, p.kills, p.freezes, p.workers, p.deadline = 120_000, 25_000, 12, 2, 4, 20*time.Minute
	}
	atoi := func(name string, dst *int) {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a number", name, v)
			}
			*dst = n
		}
	}
	atoi("CHAOS_MESSAGES", &p.messages)
	atoi("CHAOS_KILLS", &p.kills)
	atoi("CHAOS_FREEZES", &p.freezes)
	atoi("CHAOS_WORKERS", &p.workers)
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: want a number", v)
		}
		p.seed = n
	}
	if os.Getenv("CHAOS_TOPOLOGY") == "0" {
		p.topology = false
	}
	p.backlog = min(p.backlog, p.messages/4)
	p.workers = max(p.workers, 2)
	return p
}

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
	// that calls worker.Main (package internal/chaos/worker) with its
	// source. It is built with the go command from the test's directory,
	// so it must be in the test's module or its requirements. Required.
	Worker string
}

// BrokerPackage is the broker program every run uses: kfake in a process
// of its own.
const BrokerPackage = "github.com/effectively-once/effectively/internal/chaos/cmd/broker"

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
	r := newRun(t, pl, h)
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
	static    bool // workers join as static members (CHAOS_STATIC, on by default)
	crashes   []string
	// when the topology changed, and the lanes it added
	newTopicAt, addedAt time.Time
	newLanes, addLanes  []laneKey
	initialLanes        []laneKey        // the partitions when the workers start
	lockWaits           map[int][]string // by freeze event: statements seen waiting for the frozen worker
}

func newRun(t *testing.T, pl plan, h Harness) *run {
	ctx, cancel := context.WithTimeout(context.Background(), pl.deadline)
	t.Cleanup(cancel)
	r := &run{t: t, pl: pl, rng: rand.New(rand.NewPCG(uint64(pl.seed), 2)), ctx: ctx,
		slotOf: map[*proc]int{}, static: os.Getenv("CHAOS_STATIC") != "0"}
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
	sctx, stopSampler := context.WithCancel(r.ctx)
	sampled := make(chan struct{})
	go func() { defer close(sampled); r.samp.run(sctx) }()
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
		default: // a membership change: wait for the rebalance it causes
			newGenAfter = r.events[len(r.events)-1].at
		}
		r.waitStable("the group to recover from "+op, 2*time.Second+time.Duration(r.rng.IntN(2000))*time.Millisecond, fresh, newGenAfter)
	}

	r.prod.flushTo(pl.messages)
	r.waitFor("the producer to finish", r.prod.done)
	r.waitCaughtUp()
	stopSampler()
	<-sampled
	r.samp.sample(r.ctx)
	r.samp.finish()
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

// genQuiet is how long no new generation may appear for the group to
// count as settled: a member that resumed or joined rejoins within a few
// heartbeats.
const genQuiet = 3 * time.Second

// waitStable waits at least minGap, then until the group settled: every
// partition that was consumed before moved within the last 1.5s, a
// generation newer than the last event's time (for membership changes)
// and then none for genQuiet, and each of fresh (partitions just added)
// consumed from. It gives up after 2×stallBound (topologyBound with
// fresh), and the checks report the rest. Waiting for the new partitions
// keeps a later kill's rebalance from picking them up in the group's
// stead.
func (r *run) waitStable(what string, minGap time.Duration, fresh []laneKey, newGenAfter time.Time) {
	start := time.Now()
	limit := 2 * stallBound(timing)
	if len(fresh) > 0 {
		limit = topologyBound(timing)
	}
	for r.ctx.Err() == nil {
		r.checkCrashes()
		longest, lane, _ := r.samp.current()
		moves := r.samp.firstMoves()
		unseen := 0
		for _, k := range fresh {
			if _, ok := moves[k]; !ok {
				unseen++
			}
		}
		el := time.Since(start)
		if len(moves) == 0 && el >= minGap {
			return // nothing was ever consumed: there is nothing to recover (the start check reports it)
		}
		gen := r.samp.generationChanged()
		genOK := time.Since(gen) >= genQuiet && (newGenAfter.IsZero() || gen.After(newGenAfter))
		if el >= minGap && longest < 1500*time.Millisecond && unseen == 0 && genOK && r.samp.count() > 0 {
			return
		}
		if el > limit {
			r.t.Logf("%s: not settled after %s (%s has waited %s, %d new partitions never consumed from, last new generation %s); going on",
				what, el.Round(time.Millisecond), lane, longest.Round(time.Millisecond), unseen, r.since(gen))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFirstConsumed waits until every partition produced to so far has
// been consumed from, or 2×stallBound passed (then it logs what it saw and
// the checks report the rest).
func (r *run) waitFirstConsumed() {
	start := time.Now()
	for r.ctx.Err() == nil {
		r.checkCrashes()
		pos := r.samp.positions()
		var waiting []string
		for k := range r.prod.endsSnapshot() {
			if pos[k] == 0 {
				waiting = append(waiting, k.String())
			}
		}
		if len(waiting) == 0 && r.samp.count() > 0 {
			r.t.Logf("every partition consumed from %s after the workers started", time.Since(start).Round(time.Millisecond))
			return
		}

		if time.Since(start) > 2*stallBound(timing) {
			r.t.Logf("%d workers started %s ago, and %d partitions were never consumed from: %s; going on",
				len(r.live), time.Since(start).Round(time.Millisecond), len(waiting), strings.Join(waiting, " "))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFor polls cond until it holds; it fails the test when the run's
// deadline passes first.
func (r *run) waitFor(what string, cond func() bool) {
	r.t.Helper()
	for !cond() {
		if r.ctx.Err() != nil {
			r.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// noProgress is how long the end of the run waits with no partition moving
// before it gives up on the rest and reports.
const noProgress = 60 * time.Second

// waitCaughtUp waits until every partition's stored offset reached the end
// of its log, or nothing moved for noProgress.
func (r *run) waitCaughtUp() {
	for r.ctx.Err() == nil {
		r.checkCrashes()
		ends, pos := r.prod.endsSnapshot(), r.samp.positions()
		behind := 0
		for k, e := range ends {
			if pos[k] < e {
				behind++
			}
		}
		if behind == 0 {
			return
		}
		if _, _, since := r.samp.current(); since > noProgress {
			r.t.Logf("%d partitions behind and nothing moved for %s; checking what there is", behind, noProgress)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Logf("the run's deadline (%s) passed before every partition was consumed", r.pl.deadline)
}
