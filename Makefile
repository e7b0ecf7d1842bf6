# effectively: common tasks. `make test` is what CI runs.

GO        ?= go
STATICCHECK_VERSION ?= v0.8.2
FAUXQS    := internal/fauxqs/node_modules/.package-lock.json

# PKGS are the packages of every module of the workspace (go.work): the core
# and the modules beside it (cli, cmd/effectively, the adapters, the
# franz-go source and outbox sink, the benchmarks, the examples and the
# integration suites), which ./... alone would leave out.
PKGS      := $(shell $(GO) list -m -f '{{.Path}}/...')
MODDIRS   := $(shell $(GO) list -m -f '{{.Dir}}')

.PHONY: test test-race test-patroni test-short flake soak soak-kafka chaos-storm soak-outbox bench bench-expiry lint tidy demo deps release test-release apidiff

## test: the whole suite with the race detector (starts its own PostgreSQL, Kafka and SQS peers)
test: test-race

# The peers benchmark (Watermill, Sarama, hand-written kafka-go and franz-go consumers)
# is a module of its own, outside the workspace, so that the library never
# requires them; its test runs the benchmark small.
PEERS     := bench/peers

test-race: deps
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	cd $(PEERS) && GOWORK=off $(GO) test -race -count=1 -timeout 10m ./...

## test-patroni: the failover tests under Patroni (etcd and two Patroni-managed servers; `apt-get install patroni etcd-server`): Kafka and SQS, synchronous and asynchronous replication, StandbyAck off and on, the leader's postgres killed mid-run. The tests skip, saying what to install, when patroni or etcd is missing, except where CI is set
# Their files carry the build tag patroni, so that make test leaves them to
# this target; lint checks them with the tag.
PATRONI_TAGS := -tags patroni
test-patroni: deps
	$(GO) test $(PATRONI_TAGS) -race -count=1 -p 1 -timeout 30m -v -run '^TestPatroni' ./pgtest/ ./integration/failover/

## test-short: a quicker pass while iterating
test-short: deps
	$(GO) test -short -count=1 $(PKGS)

## flake: the whole suite five times over with the race detector, to catch flaky tests
flake: deps
	$(GO) test -race -count=5 -timeout 60m $(PKGS)

## soak: the consumer's invariant test over SOAK_SEEDS seeds (default 200) per strategy and handler shape, after soak-kafka and soak-outbox
SOAK_SEEDS ?= 200
soak: soak-kafka soak-outbox
	INVARIANT_SEEDS=$(SOAK_SEEDS) $(GO) test -race -count=1 -timeout 4h -run '^TestInvariant$$' $(SOAK_FLAGS) ./consumer/

## soak-outbox: the outbox's chained invariants at 100,000 inputs: in process (stage A, outbox, relays, Kafka, stage B), then with every stage and relay a child process killed with SIGKILL (log and table relays, Kafka, SQS standard and FIFO; without the race detector, as the chaos workers, so that a dozen instrumented processes do not starve the machine)
soak-outbox:
	CHAIN_INPUTS=100000 $(GO) test -race -count=1 -timeout 30m -v -run '^TestChained$$' ./outbox/
	CHAIN_KILL_INPUTS=100000 $(GO) test -count=1 -timeout 90m -v -run '^TestChainedKill$$' ./outbox/

# The Kafka chaos tests, in the integration module: integration/chaos for
# sources/kafka, integration/chaos/franz for sources/franz. make test runs
# them short with the other packages; soak-kafka runs them at full length,
# one at a time.
CHAOS     := github.com/effectively-once/effectively/integration/chaos github.com/effectively-once/effectively/integration/chaos/franz

## soak-kafka: the Kafka sources' multi-process chaos run at full length, sources/kafka's then sources/franz's (120,000 messages, 12 kills, 2 freezes; see integration/chaos for the CHAOS_* variables)
soak-kafka:
	CHAOS_FULL=1 $(GO) test -race -count=1 -timeout 60m -p 1 -v -run '^TestChaos$$' $(CHAOS)

## chaos-storm: what kills cost, as a ratio in one command: the chaos run's workload as a backlog consumed calm, then under a kill storm (8 SIGKILLs, one every 2s, each worker replaced in its slot), each phase checked like the chaos run; both rates and the ratio per run and the medians, sources/franz's (static members) then sources/kafka's. STORM_RUNS (default 3); CHAOS_STATIC=0 makes the franz workers dynamic members
STORM_RUNS ?= 3
chaos-storm:
	CHAOS_STORM=1 CHAOS_STORM_RUNS=$(STORM_RUNS) $(GO) test -count=1 -timeout 90m -p 1 -v -run '^TestKillStorm$$' $(word 2,$(CHAOS)) $(word 1,$(CHAOS))

## deps: the pinned SQS emulator used by the tests, after a check that the servers the tests start are installed
deps: servers $(FAUXQS)

# servers: the tests start throwaway PostgreSQL servers and PgBouncers from
# the machine's binaries; say what to install when they are missing, before
# hundreds of tests fail on it.
.PHONY: servers
servers:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		{ echo "PostgreSQL's server binaries (initdb, pg_ctl) are missing: apt-get install postgresql (or set TEST_DATABASE_URL)"; exit 1; }
	@command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || \
		{ echo "PgBouncer is missing: apt-get install pgbouncer (the tests run every component through it)"; exit 1; }
	@command -v npm >/dev/null 2>&1 || \
		{ echo "npm is missing: apt-get install nodejs npm (the tests' SQS emulator is an npm package)"; exit 1; }

$(FAUXQS): internal/fauxqs/package.json internal/fauxqs/package-lock.json
	npm ci --prefix internal/fauxqs --no-audit --no-fund

## bench: the engine side by side with a naive consumer and raw SQL (see BENCHMARKS.md)
bench:
	$(GO) run ./bench/cmd/benchtable

## bench-expiry: bloom vs idset at 10,000,000 live markers (a few minutes, ~3 GB of temporary disk)
bench-expiry:
	$(GO) run ./bench/cmd/expirytable

## bench-outbox: the outbox's emit overhead, relay throughput and commit-to-publish latency, then the two-stage chain against stage A alone (see BENCHMARKS.md; CHAIN_FLAGS e.g. -n 100000 -runs 5 -cpuprofile chain.pprof)
.PHONY: bench-outbox
bench-outbox:
	$(GO) run ./bench/cmd/outboxtable
	$(GO) run ./bench/cmd/chaintable $(CHAIN_FLAGS)

## bench-lanes: each handler shape and raw SQL at 1, 2, 4 and 8 lanes, with CPU, WAL fsync and wait events per row (see BENCHMARKS.md; LANES_FLAGS e.g. -synchronous-commit on,off -runs 5)
.PHONY: bench-lanes
bench-lanes:
	$(GO) run ./bench/cmd/lanestable $(LANES_FLAGS)

## bench-http: requests/s through the idempotency middleware against the bare handler over loopback (see docs/http.md; HTTP_FLAGS e.g. -clients 8,32 -runs 5)
.PHONY: bench-http
bench-http:
	$(GO) run ./bench/cmd/httptable $(HTTP_FLAGS)

## bench-latency: the Kafka path's end-to-end latency (scheduled send to COMMIT, open-loop producer) per handler shape: p50/p99/max at fixed rates, the highest sustained rate, and p50/p99 at 1k, 20k, half of it and it (a few minutes; LATENCY_FLAGS e.g. -duration 10s -rates 1000,20000 -runs 3)
.PHONY: bench-latency
bench-latency:
	$(GO) run ./bench/cmd/latencytable -search $(LATENCY_FLAGS)

## bench-peers: this library's Kafka pipeline beside Watermill and hand-written kafka-go and franz-go consumers, throughput and a kill -9 between commit and ack (bench/peers, its own module; a few minutes; PEERS_FLAGS e.g. -scale 0.5 -runs 5)
.PHONY: bench-peers
bench-peers:
	cd bench/peers && GOWORK=off $(GO) run ./cmd/peerstable $(PEERS_FLAGS)

## lint: go vet and staticcheck, over every module
lint:
	$(GO) vet $(PATRONI_TAGS) $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PATRONI_TAGS) $(PKGS)
	for d in $(PEERS) $(RELEASE); do (cd $$d && GOWORK=off $(GO) vet ./... && GOWORK=off $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...) || exit 1; done

## tidy: go mod tidy in each module (each names the core through a replace, so this works outside the workspace)
tidy:
	for d in $(MODDIRS) $(PEERS) $(RELEASE); do (cd $$d && GOWORK=off $(GO) mod tidy) || exit 1; done

# The release steps are a module of their own, outside the workspace, so
# that the core never requires golang.org/x/mod or golang.org/x/exp (see
# docs/releasing.md).
RELEASE   := internal/release

## release: rewrite the released modules' go.mod and go.sum for VERSION (e.g. make release VERSION=v0.1.0): each requires the others at VERSION, with no replace directives; then commit and make the tags it prints (docs/releasing.md)
release:
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=v0.1.0"; exit 2; }
	cd $(RELEASE) && GOWORK=off $(GO) run . prepare -root ../.. $(VERSION)

## test-release: prove a release installs: a copy of the tree released at a fake version, served from a file-based GOPROXY, must be tidy and go install cmd/effectively@version with no workspace (and the release steps' own tests)
test-release:
	cd $(RELEASE) && GOWORK=off $(GO) test -count=1 -timeout 10m ./...

## apidiff: each released module's exported API against its last tag (vX.Y.Z, cli/vX.Y.Z, ...); fails on an incompatible change, skips a module with no tag yet
apidiff:
	cd $(RELEASE) && GOWORK=off $(GO) run . apidiff -root ../..

## demo: the quickstart ledger demo
demo:
	$(GO) run ./examples/quickstart

## demo-soak: the README's demo DEMO_RUNS times in a row (default 30), taking turns on a throwaway server, DATABASE_URL, and PgBouncer; every run must end OK within its bound
DEMO_RUNS ?= 30
.PHONY: demo-soak
demo-soak:
	DEMO_SOAK_RUNS=$(DEMO_RUNS) $(GO) test -count=1 -timeout 0 -v -run '^TestDemoSoak$$' ./examples/quickstart/
