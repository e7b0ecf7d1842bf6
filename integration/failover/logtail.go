package failover

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/effectively-once/effectively/consumer/consumertest"
)

// logTailLines is how many of the last log lines a failed test prints.
const logTailLines = 300

// logger is the consumer's and the source's logger. With TEST_LOG set it
// writes everything to stderr. Otherwise it keeps the last logTailLines
// lines at debug level in memory and prints them only when t fails: a
// switch rolls back many batches, each logged, so a passing test stays
// quiet, and a failing one shows what the consumer and the source saw
// last (a Kafka commit refused, a claim waiting, a generation ended).
func logger(t testing.TB) *slog.Logger {
	if l := consumertest.Logger(); l != nil {
		return l
	}
	tail := &logTail{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last %d log lines of the consumer and the source:\n%s", logTailLines, tail.String())
		}
	})
	return slog.New(slog.NewTextHandler(tail, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// logTail is an io.Writer keeping the last logTailLines lines written.
type logTail struct {
	mu    sync.Mutex
	lines []string
	next  int
	full  bool
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		if l.lines == nil {
			l.lines = make([]string, logTailLines)
		}
		l.lines[l.next] = string(line)
		l.next = (l.next + 1) % logTailLines
		l.full = l.full || l.next == 0
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	if l.full {
		out = append(out, l.lines[l.next:]...)
	}
	out = append(out, l.lines[:l.next]...)
	return strings.Join(out, "\n")
}
