// Package franz runs sources/franz through the chaos run sources/kafka
// runs (package chaostest): worker processes killed with SIGKILL, frozen
// with SIGSTOP and replaced, topics created and partitions added while a paced stream with producer duplicates and poison messages
// flows; then exactly one effect per message, exactly the poison messages
// parked, stored offsets that never went backwards, stalls within bound.
package franz_test

import (
	"testing"

	"github.com/effectively-once/effectively/integration/chaos/chaostest"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var franzWorker = chaostest.Harness{Worker: "github.com/effectively-once/effectively/integration/chaos/franz/cmd/worker", StaticMembership: true}

// TestChaos: see chaostest.Run and its environment variables.
func TestChaos(t *testing.T) { chaostest.Run(t, franzWorker) }

// TestWorkerThatCannotStart: a worker that fails before it is ready makes
// the run stop at once with the worker's own error.
func TestWorkerThatCannotStart(t *testing.T) { chaostest.WorkerThatCannotStart(t, franzWorker) }

// TestKillStorm measures the throughput of a kill storm against the same
// run without kills (chaostest.Storm; CHAOS_STORM=1 runs it).
func TestKillStorm(t *testing.T) { chaostest.Storm(t, franzWorker) }
