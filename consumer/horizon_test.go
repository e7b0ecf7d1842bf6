package consumer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"
)

type retention time.Duration

func (r retention) Retention() time.Duration { return time.Duration(r) }

// flakyHorizon cannot say its horizon for its first fails calls.
type flakyHorizon struct {
	mu    sync.Mutex
	fails int
	calls int
}

func (h *flakyHorizon) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	if h.calls <= h.fails {
		return 0, errors.New("brokers unreachable")
	}
	return 2 * time.Hour, nil
}

// records sends the message of every record logged at Warn or above.
type records chan string

func (r records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r records) Handle(_ context.Context, rec slog.Record) error {
	r <- rec.Message
	return nil
}
func (r records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r records) WithGroup(string) slog.Handler      { return r }

// TestHorizonAskedAgain: a source that cannot say its redelivery horizon at
// start-up is asked again in the background until it can, and the
// retention warning then comes.
func TestHorizonAskedAgain(t *testing.T) {
	defer func(d time.Duration) { horizonRetry = d }(horizonRetry)
	horizonRetry = time.Millisecond
	logs := make(records, 16)
	h := &flakyHorizon{fails: 3}
	c := &Consumer{path: path{capabilities: capabilities{retainer: retention(time.Hour), horizon: h}, log: slog.New(logs)}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.horizonChecked = c.checkHorizon(ctx)
	if c.horizonChecked {
		t.Fatal("the first, failing, call reported the horizon checked")
	}
	var wg sync.WaitGroup
	c.startBackground(ctx, &wg)
	timeout := time.After(time.Minute)
	for {
		select {
		case msg := <-logs:
			if msg == "dedupe retention is shorter than the source's redelivery horizon: a message redelivered after its marker expired would be applied again" {
				wg.Wait() // the retry loop ends once it has an answer
				if h.calls != h.fails+1 {
					t.Errorf("asked %d times, want %d", h.calls, h.fails+1)
				}
				return
			}
		case <-timeout:
			t.Fatalf("no retention warning after %d calls", h.calls)
		}
	}
}
