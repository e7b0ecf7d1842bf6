package outbox

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// TestChainedKill is the pipeline's invariant with real crashes: every
// process of the chain but the peers is a child process (this test binary
// running TestChainChild) killed with SIGKILL while it works, and started
// again. Logical inputs, some produced twice and some poison for one stage
// or the other, go to a Kafka topic; stage A (a Kafka consumer whose
// BatchHandler emits one message per input) writes them to the outbox; two
// relays (log relays: one reading the slot, one standing by; or two
// table-polling relays sharing the partitions) publish them to Kafka, to an
// SQS standard queue or to an SQS FIFO queue; stage B (a BatchHandler over
// that topic or queue) records them. Kills follow stage B's progress, so
// they land while every process has work: the active relay, stage A and
// stage B in turn.
//
// At the end: stage B applied exactly one effect per logical input that no
// stage refused, each stage parked exactly its poison inputs, and (but on
// the SQS standard queue, which orders nothing) each key's first deliveries
// reached stage B in the order the inputs were produced, which is stage A's
// commit order (a key is one partition of the input topic, applied in
// order). The report is logged. CHAIN_KILL_INPUTS sets the size per run
// (default 2,000, about a minute for the four runs; `make soak-outbox`
// runs 100,000) and CHAIN_KILL_RUNS
// selects runs by name (e.g. "kafka-log,sqs-fifo-log").
func TestChainedKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen processes; skipped with -short")
	}
	inputs := 2000
	if s := os.Getenv("CHAIN_KILL_INPUTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 100 {
			t.Fatalf("CHAIN_KILL_INPUTS=%q: want a number of at least 100", s)
		}
		inputs = n
	}
	only := map[string]bool{}
	for _, s := range strings.Split(os.Getenv("CHAIN_KILL_RUNS"), ",") {
		if s != "" {
			only[s] = true
		}
	}
	for _, c := range []chainRun{
		{name: "kafka-log", log: true},
		{name: "kafka-table"},
		{name: "sqs-standard-log", sqs: true, log: true},
		{name: "sqs-fifo-log", sqs: true, fifo: true, log: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if len(only) > 0 && !only[c.name] {
				t.Skip("not in CHAIN_KILL_RUNS")
			}
			c.inputs = inputs
			testChainedKill(t, c)
		})
	}
}

type chainRun struct {
	name           string
	sqs, fifo, log bool
	inputs         int
}

func testChainedKill(t *testing.T, run chainRun) {
	const accounts = 40
	ctx := context.Background()
	url := pgtest.URL(t)
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.Exec(ctx, `CREATE TABLE a_effects (input text PRIMARY KEY, serial bigserial, account text, msg_id text);
CREATE TABLE b_effects (serial bigserial, input text, account text, msg_id text)`); err != nil {
		t.Fatal(err)
	}
	k := kafkatest.New(t)
	in, out := kafkatest.Name("inputs"), kafkatest.Name("outputs")
	for _, topic := range []string{in, out} {
		if err := k.CreateTopic(ctx, topic, 4); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{chainDB + "=" + url, chainBrokers + "=" + strings.Join(k.Brokers(), ","), chainIn + "=" + in, chainOut + "=" + out}
	if !run.log {
		env = append(env, chainTable+"=1") // stage A emits for the table-polling relay
	}
	if run.sqs {
		c := fauxqs.Client(t)
		name := "chain"
		if run.fifo {
			name += ".fifo"
		}
		env = append(env, chainQueue+"="+fauxqs.NewQueue(t, c, name, nil), fauxqs.EnvEndpoint+"="+fauxqs.Endpoint(t))
	}

	// The inputs, in order per key (a key is one partition); every 17th
	// produced twice, as a producer's retry would.
	var msgs []kafkago.Message
	wantA, wantB := map[int]bool{}, map[int]bool{}
	parkA, parkB := map[int]bool{}, map[int]bool{}
	produced := 0
	for n := range run.inputs {
		id := fmt.Sprintf("in-%d", n)
		m := kafkago.Message{Key: []byte(fmt.Sprintf("acct-%d", n%accounts)), Value: []byte(id),
			Headers: []kafkago.Header{{Key: "idempotency-key", Value: []byte(id)}}}
		msgs = append(msgs, m)
		if n%17 == 0 {
			msgs = append(msgs, m)
		}
		switch {
		case chainPoisonA(n):
			parkA[n] = true
		case chainPoisonB(n):
			wantA[n], parkB[n] = true, true
		default:
			wantA[n], wantB[n] = true, true
		}
	}
	w := k.Writer(in)
	w.Balancer = &kafkago.Hash{}
	for len(msgs) > 0 {
		batch := msgs[:min(len(msgs), 5000)]
		if err := w.WriteMessages(ctx, batch...); err != nil {
			t.Fatal(err)
		}
		msgs = msgs[len(batch):]
		produced += len(batch)
	}
	_ = w.Close()

	relayRole := "table-relay"
	if run.log {
		relayRole = "log-relay"
	}
	procs := newChainProcs(t, env)
	// Registered after procs's: runs first, with the children still up.
	t.Cleanup(func() {
		if t.Failed() {
			chainStall(t, db, k, wantB, accounts)
		}
	})
	// The stages first: they migrate the outbox and their own tables, so
	// that no table is created while the log relay creates its slot. (With
	// stage B's tables created meanwhile, PostgreSQL 15.18 failed to
	// decode the slot after a relay's restart, on every try: "could not map
	// filenode ... to relation OID" for stage B's dedupe table. The relays
	// then retry forever and publish nothing; see docs/pipelines.md.)
	procs.start("stage-a", "stage-a")
	procs.start("stage-b", "stage-b")
	procs.start("relay-1", relayRole)
	procs.start("relay-2", relayRole)

	// Kills at fractions of stage B's progress, the active relay (for log
	// relays, the one holding the slot) and each stage in turn.
	type kill struct {
		at     float64
		target string
	}
	schedule := []kill{{0.10, "relay"}, {0.25, "stage-a"}, {0.40, "stage-b"}, {0.55, "relay"}, {0.70, "stage-a"},
		{0.80, "relay"}, {0.90, "stage-b"}}
	relayKills := 0
	for _, k := range schedule {
		waitAtLeast(t, db, 5*time.Minute, int(k.at*float64(len(wantB))), `SELECT count(DISTINCT input) FROM b_effects`)
		procs.checkAlive()
		target := k.target
		if target == "relay" {
			target = procs.activeRelay(ctx, db, relayKills)
			relayKills++
		}
		t.Logf("killing %s at %.0f%%", target, 100*k.at)
		procs.kill(target)
		procs.start(target, procs.roles[target])
	}
	waitRows(t, db, 5*time.Minute, len(wantB), `SELECT count(DISTINCT input) FROM b_effects`)
	// At least: a second parked row of an input fails the checks below.
	waitAtLeast(t, db, 5*time.Minute, len(parkB), `SELECT count(*) FROM effectively.parked WHERE consumer = 'stage-b'`)
	waitAtLeast(t, db, time.Minute, len(parkA), `SELECT count(*) FROM effectively.parked WHERE consumer = 'stage-a'`)
	procs.checkAlive()
	procs.killAll()

	// Exactly one effect per logical input at each stage.
	check := func(stage, table string, want map[int]bool) {
		var total int
		var wrong []string
		seen := map[int]bool{}
		rows, err := db.Query(ctx, `SELECT input FROM `+table)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			total++
			n := chainInput(s)
			if seen[n] || !want[n] {
				wrong = append(wrong, s)
			}
			seen[n] = true
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if total != len(want) || len(seen) != len(want) || len(wrong) > 0 {
			t.Fatalf("stage %s applied %d effects for %d distinct inputs, want exactly one each of %d; %d applied twice or not to be applied (first: %v)",
				stage, total, len(seen), len(want), len(wrong), wrong[:min(len(wrong), 5)])
		}
	}
	check("A", "a_effects", wantA)
	check("B", "b_effects", wantB)

	// Exactly the poison inputs parked, each stage its own.
	parked := map[string]map[int]bool{"stage-a": {}, "stage-b": {}}
	for _, p := range consumertest.Parked(t, db, "", "") {
		input := string(p.Payload)
		for _, h := range p.Headers {
			if h.Key == "input" {
				input = string(h.Value)
			}
		}
		if parked[p.Consumer] == nil || parked[p.Consumer][chainInput(input)] {
			t.Errorf("unexpected parked row: consumer %s, input %s", p.Consumer, input)
			continue
		}
		parked[p.Consumer][chainInput(input)] = true
	}
	for consumerName, want := range map[string]map[int]bool{"stage-a": parkA, "stage-b": parkB} {
		for n := range want {
			if !parked[consumerName][n] {
				t.Errorf("%s did not park poison input in-%d", consumerName, n)
			}
		}
		if len(parked[consumerName]) != len(want) {
			t.Errorf("%s parked %d inputs, want its %d poison ones", consumerName, len(parked[consumerName]), len(want))
		}
	}

	// Per key, stage B's applications (first deliveries) in the order the
	// inputs were produced, which stage A committed them in.
	keysChecked, orderChecked := 0, 0
	if !run.sqs || run.fifo {
		byKey := map[string][]int{}
		rows, err := db.Query(ctx, `SELECT account, input FROM b_effects ORDER BY serial`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var acct, input string
			if err := rows.Scan(&acct, &input); err != nil {
				t.Fatal(err)
			}
			byKey[acct] = append(byKey[acct], chainInput(input))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for acct, ns := range byKey {
			keysChecked++
			orderChecked += len(ns)
			if !sort.IntsAreSorted(ns) {
				t.Errorf("key %s: stage B applied its %d messages out of commit order", acct, len(ns))
			}
		}
	}

	st := procs.report()
	order := fmt.Sprintf("%d keys, %d first deliveries in commit order", keysChecked, orderChecked)
	if keysChecked == 0 {
		order = "none (a standard queue keeps no order)"
	}
	t.Logf("chain %s: %d logical inputs (%d produced, %d of them twice), %d poison parked at stage A, %d at stage B, %d effects at stage B; "+
		"kills (SIGKILL): %d relay, %d stage A, %d stage B; relay processes started %d times; "+
		"stage A dropped %d duplicates, stage B %d (counted by the processes, up to 100 ms of counts lost at each kill), relays published %d; order checks: %s",
		run.name, run.inputs, produced, produced-run.inputs, len(parkA), len(parkB), len(wantB),
		st.kills["relay"], st.kills["stage-a"], st.kills["stage-b"], st.starts["relay"],
		st.dupes["stage-a"], st.dupes["stage-b"], st.applied["relay"], order)
}

// chainProcs are the chain's child processes, by name.
type chainProcs struct {
	t     *testing.T
	env   []string
	roles map[string]string // name → role

	mu    sync.Mutex
	procs map[string]*chainProc
	// counts of the incarnations that ended, by role kind
	starts, kills, applied, dupes map[string]int
}

type chainProc struct {
	name, role string
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	exited     chan struct{}
	killed     bool

	mu   sync.Mutex
	last [3]int // the last "stats" line: applied, duplicates, parked
}

func newChainProcs(t *testing.T, env []string) *chainProcs {
	p := &chainProcs{t: t, env: env, roles: map[string]string{}, procs: map[string]*chainProc{},
		starts: map[string]int{}, kills: map[string]int{}, applied: map[string]int{}, dupes: map[string]int{}}
	t.Cleanup(p.killAll)
	return p
}

func chainKind(role string) string {
	if strings.HasSuffix(role, "relay") {
		return "relay"
	}
	return role
}

// start runs a child process in role under name, with application_name
// set to name, and waits for it to be ready.
func (p *chainProcs) start(name, role string) {
	t := p.t
	t.Helper()
	p.mu.Lock()
	p.starts[chainKind(role)]++
	life := p.starts[chainKind(role)]
	p.mu.Unlock()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChainChild$", "-test.count=1")
	env := append(os.Environ(), p.env...)
	for i, e := range env {
		if strings.HasPrefix(e, chainDB+"=") {
			sep := "?"
			if strings.Contains(e, "?") {
				sep = "&"
			}
			env[i] = e + sep + "application_name=" + fmt.Sprintf("%s-%d", name, life)
		}
	}
	cmd.Env = append(env, chainRole+"="+role)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe() // held open: the child stops when it closes
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &chainProc{name: name, role: role, cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if line == "ready" {
				close(ready)
			} else if rest, ok := strings.CutPrefix(line, "stats "); ok {
				var a, d, pk int
				if _, err := fmt.Sscan(rest, &a, &d, &pk); err == nil {
					c.mu.Lock()
					c.last = [3]int{a, d, pk}
					c.mu.Unlock()
				}
			}
		}
		_ = cmd.Wait()
		close(c.exited)
	}()
	select {
	case <-ready:
	case <-c.exited:
		t.Fatalf("child %s (%s) exited before it was ready", name, role)
	case <-time.After(2 * time.Minute):
		t.Fatalf("child %s (%s) not ready after two minutes", name, role)
	}
	p.mu.Lock()
	p.procs[name] = c
	p.roles[name] = role
	p.mu.Unlock()
}

// kill sends SIGKILL to the named child and waits for it to exit.
func (p *chainProcs) kill(name string) {
	p.mu.Lock()
	c := p.procs[name]
	delete(p.procs, name)
	p.mu.Unlock()
	if c == nil {
		return
	}
	c.killed = true
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
	c.mu.Lock()
	defer c.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kills[chainKind(c.role)]++
	p.applied[chainKind(c.role)] += c.last[0]
	p.dupes[chainKind(c.role)] += c.last[1]
}

func (p *chainProcs) killAll() {
	p.mu.Lock()
	var names []string
	for n := range p.procs {
		names = append(names, n)
	}
	p.mu.Unlock()
	for _, n := range names {
		p.kill(n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// The final kills end the run; they are not the test's kills.
	for _, n := range names {
		p.kills[chainKind(p.roles[n])]--
	}
}

// checkAlive fails the test if a child exited without being killed.
func (p *chainProcs) checkAlive() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, c := range p.procs {
		select {
		case <-c.exited:
			p.t.Fatalf("child %s (%s) exited on its own (%v)", n, c.role, c.cmd.ProcessState)
		default:
		}
	}
}

// activeRelay returns the relay to kill: for log relays the one reading
// the slot (its replication connection carries its application_name),
// for table relays each in turn.
func (p *chainProcs) activeRelay(ctx context.Context, db *pgxpool.Pool, i int) string {
	p.t.Helper()
	if p.roles["relay-1"] == "log-relay" {
		deadline := time.Now().Add(time.Minute)
		for {
			var app string
			err := db.QueryRow(ctx, `SELECT application_name FROM pg_stat_replication WHERE application_name LIKE 'relay-%' LIMIT 1`).Scan(&app)
			if err == nil {
				return app[:strings.LastIndex(app, "-")]
			}
			if time.Now().After(deadline) {
				p.t.Fatalf("no log relay reads the slot: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return fmt.Sprintf("relay-%d", 1+i%2)
}

type chainReport struct{ starts, kills, applied, dupes map[string]int }

func (p *chainProcs) report() chainReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	return chainReport{starts: p.starts, kills: p.kills, applied: p.applied, dupes: p.dupes}
}

// chainStall logs, for a run that failed, where the inputs stage B lacks
// stopped: not applied at stage A (its consumer never took them), in the
// outbox and not confirmed, or gone from it (published, then cleaned up),
// with their keys, the stages' committed offsets, the slot's state and,
// on the in-process cluster, the stages' group members (a member whose
// process is gone holds its partitions until the group drops it).
func chainStall(t *testing.T, db *pgxpool.Pool, k *kafkatest.Cluster, wantB map[int]bool, accounts int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	atB := map[int]bool{}
	rows, err := db.Query(ctx, `SELECT DISTINCT input FROM b_effects`)
	if err != nil {
		t.Logf("stall report: %v", err)
		return
	}
	for rows.Next() {
		var s string
		if rows.Scan(&s) == nil {
			atB[chainInput(s)] = true
		}
	}
	rows.Close()
	var missing []string
	for n := range wantB {
		if !atB[n] {
			missing = append(missing, fmt.Sprintf("in-%d", n))
		}
	}
	sort.Strings(missing)
	var notA, waiting, gone int
	var keys []string
	err = db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE a.input IS NULL),
    count(*) FILTER (WHERE a.input IS NOT NULL AND o.id IS NOT NULL),
    count(*) FILTER (WHERE a.input IS NOT NULL AND o.id IS NULL),
    coalesce(array_agg(DISTINCT 'acct-' || (substring(m.input FROM 4)::int % $2)), '{}')
FROM unnest($1::text[]) AS m(input)
LEFT JOIN a_effects a ON a.input = m.input
LEFT JOIN effectively.outbox o ON o.msg_id = a.msg_id`, missing, accounts).Scan(&notA, &waiting, &gone, &keys)
	if err != nil {
		t.Logf("stall report: %v", err)
		return
	}
	sort.Strings(keys)
	t.Logf("stall report: stage B lacks %d inputs (first: %v): %d not applied at stage A, %d in the outbox's messages table, %d applied at stage A and not in it (published, or in the log table); their keys: %v",
		len(missing), missing[:min(len(missing), 5)], notA, waiting, gone, keys)
	for _, q := range []string{
		`SELECT group_id, topic, partition, next_offset, high_offset, generation, updated_at FROM effectively.kafka_offsets ORDER BY 1, 2, 3`,
		`SELECT slot_name, active, confirmed_flush_lsn, pg_current_wal_lsn() FROM pg_replication_slots`,
		// LogMode emits wait in the log table (not counted above).
		`SELECT half, count(*), coalesce(sum(n), 0), min(created_at) FROM effectively.outbox_log GROUP BY half`,
		`SELECT half FROM effectively.outbox_log_half`,
		`SELECT application_name, state, backend_start FROM pg_stat_activity WHERE datname = current_database() AND application_name <> '' ORDER BY 1`,
	} {
		rows, err := db.Query(ctx, q)
		if err != nil {
			t.Logf("stall report: %v", err)
			continue
		}
		for rows.Next() {
			vals, _ := rows.Values()
			t.Logf("stall report: %v", vals)
		}
		rows.Close()
	}
	if k.Fake() == nil {
		return
	}
	for _, group := range []string{"stage-a", "stage-b"} {
		if g := k.Fake().GroupInfo(group); g != nil {
			for _, m := range g.Members {
				t.Logf("stall report: group %s (%s, generation %d): member %s from %s assigned %v",
					group, g.State, g.Epoch, m.MemberID, m.ClientHost, m.Assignment)
			}
		}
	}
}
