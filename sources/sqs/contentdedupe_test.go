package sqs_test

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

// TestContentBasedDedupeWarning: on a FIFO queue with content-based
// deduplication, a message sent without a MessageDeduplicationId has the
// SHA-256 of its body as Message.ID, so a deliberate resend of the same
// body after SQS's five-minute window carries the same ID and the idset
// strategy (seven days of retention by default) drops it. The consumer
// warns at start-up; on a FIFO queue without content-based deduplication
// it does not.
func TestContentBasedDedupeWarning(t *testing.T) {
	t.Parallel()
	c := client(t)
	for _, tc := range []struct {
		name  string
		attrs map[string]string
		warn  bool
	}{
		{"content-based", map[string]string{"ContentBasedDeduplication": "true"}, true},
		{"explicit IDs", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			queue := fauxqs.NewQueue(t, c, "contentdedupe.fifo", tc.attrs)
			e := newE2E(t, queue)
			logs := &syncBuffer{}
			logger := slog.New(slog.NewTextHandler(logs, nil))
			src := e.source(sqs.Config{Logger: logger})
			body := "same body, sent on purpose"
			msg := outgoing{Body: body, Group: "g"}
			if tc.attrs == nil {
				msg.DedupeID = "explicit-1"
			}
			send(t, c, queue, []outgoing{msg})
			co := e.consumer(src, consumer.Config{Logger: logger})
			r := consumertest.Start(co)
			e.waitFor("the message applied", 30*time.Second, e.drained(1))
			r.Stop(t)

			ids := e.effectCounts()
			sum := sha256.Sum256([]byte(body))
			if _, ok := ids[hex.EncodeToString(sum[:])]; tc.warn && !ok {
				t.Errorf("applied IDs %v, want the SHA-256 of the body (SQS's content-based MessageDeduplicationId)", ids)
			}
			warned := strings.Contains(logs.String(), "deliberate resend")
			if warned != tc.warn {
				t.Errorf("start-up warning about deliberate resends: %v, want %v; logs:\n%s", warned, tc.warn, logs.String())
			}
		})
	}
}

// syncBuffer is a strings.Builder safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
