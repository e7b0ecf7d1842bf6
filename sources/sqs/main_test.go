package sqs_test

import (
	"testing"

	"github.com/effectively-once/effectively/pgtest"
)

// TestMain stops the throwaway PostgreSQL server at the end; the emulator
// started by internal/fauxqs stops when the test binary exits.
func TestMain(m *testing.M) { pgtest.Main(m) }
