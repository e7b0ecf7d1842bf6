package chaos_test

import (
	"testing"

	"github.com/effectively-once/effectively/integration/chaos/chaostest"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// kafkaWorker is the worker program over sources/kafka.
var kafkaWorker = chaostest.Harness{Worker: "github.com/effectively-once/effectively/integration/chaos/cmd/worker"}

// TestChaos runs sources/kafka through the shared chaos run (see
// chaostest.Run): worker processes killed, frozen and replaced while the
// topics change, then exactly one effect per message.
func TestChaos(t *testing.T) { chaostest.Run(t, kafkaWorker) }

// TestWorkerThatCannotStart: a worker that fails before it is ready makes
// the run stop at once with the worker's own error.
func TestWorkerThatCannotStart(t *testing.T) { chaostest.WorkerThatCannotStart(t, kafkaWorker) }

// TestKillStorm measures the throughput of a kill storm against the same
// run without kills (chaostest.Storm; CHAOS_STORM=1 runs it).
func TestKillStorm(t *testing.T) { chaostest.Storm(t, kafkaWorker) }
