package highwater_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/jackc/pgx/v5"
)

// ackLog is a consumer hook that records which (sender, seq) the consumer
// has settled for good (applied or duplicate): the producers' acks.
type ackLog struct {
	mu    sync.Mutex
	acked map[string]bool
}

func (a *ackLog) BatchDone(context.Context, *consumer.BatchStats) {}

func (a *ackLog) MessageDone(_ context.Context, e consumer.MessageEvent) {
	m, o := e.Message, e.Outcome
	if o != consumer.OutcomeApplied && o != consumer.OutcomeDuplicate {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.acked[m.DedupeKey.Sender+"#"+strconv.FormatInt(m.DedupeKey.Seq, 10)] = true
}

func (a *ackLog) isAcked(sender string, seq int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acked[sender+"#"+strconv.FormatInt(seq, 10)]
}

type lossyPayload struct {
	Sender string `json:"sender"`
	Seq    int64  `json:"seq"`
	Delta  int64  `json:"delta"`
}

// TestLossyChannel runs the strategy through the consumer engine over an
// at-least-once broker. Several producers number their messages and resend
// every unacknowledged one, in a shuffled order, over a channel that drops
// a third of the sends and spreads them over lanes that run in parallel;
// the broker adds duplicates, lost acknowledgements and two crashes, and
// the handler fails now and then. At the end every message was applied
// exactly once, in its sender's order, and every mark equals its sender's
// last seq. A message with a malformed seq header is parked, not lost.
func TestLossyChannel(t *testing.T) {
	t.Parallel()
	const (
		producers = 5
		lastSeq   = 40
		window    = 8 // each producer has at most this many unacked messages in flight
	)
	pool, _ := newPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (sender text NOT NULL, seq bigint NOT NULL, delta bigint NOT NULL,
	    applied bigint GENERATED ALWAYS AS IDENTITY)`); err != nil {
		t.Fatal(err)
	}
	s, err := highwater.New(highwater.Config{ReorderWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{Lanes: 4, DuplicateRate: 0.2, LostAckRate: 0.05, Seed: 3})
	acks := &ackLog{acked: map[string]bool{}}
	var failMu sync.Mutex
	failRng := rand.New(rand.NewPCG(11, 12))
	c, err := consumer.New(pool, broker, consumer.Config{
		Name:     "lossy",
		Strategy: s,
		KeyFunc: func(m *consumer.Message) (dedupe.Key, error) {
			return highwater.HeaderKey(m.Header, "", "")
		},
		Handler: consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, p lossyPayload) error {
			failMu.Lock()
			fail := failRng.IntN(20) == 0
			failMu.Unlock()
			if fail {
				return errors.New("transient failure")
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (sender, seq, delta) VALUES ($1, $2, $3)`, p.Sender, p.Seq, p.Delta)
			return err
		}),
		// Deliveries spent waiting for a gap count as attempts too, so a
		// message that waited long and then failed once would be parked
		// (with its marker, not lost); here every message must apply.
		MaxAttempts:     1 << 30,
		BatchSize:       16,
		Concurrency:     4,
		RetryBackoff:    2 * time.Millisecond,
		MaxRetryBackoff: 10 * time.Millisecond,
		GapDelay:        2 * time.Millisecond,
		GapMaxAttempts:  100_000,
		Hooks:           []consumer.Hook{acks},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	send := func(sender string, seq int64, seqHeader string) {
		p, _ := json.Marshal(lossyPayload{Sender: sender, Seq: seq, Delta: seq * 10})
		broker.Publish(rand.IntN(4), consumer.Message{
			Value:   p,
			Headers: []consumer.Header{{Key: "sender", Value: []byte(sender)}, {Key: "seq", Value: []byte(seqHeader)}},
		})
	}
	send("p0", 0, "7x") // malformed: parked with the reason

	rng := rand.New(rand.NewPCG(5, 6))
	deadline := time.Now().Add(60 * time.Second)
	for round := 0; ; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("producers not done after %d rounds; stats %+v", round, s.Stats())
		}
		if round == 4 || round == 9 {
			broker.Crash()
		}
		pending := 0
		var sends [][2]any
		for p := range producers {
			sender := fmt.Sprintf("p%d", p)
			inFlight := 0
			for seq := int64(1); seq <= lastSeq && inFlight < window; seq++ {
				if acks.isAcked(sender, seq) {
					continue
				}
				inFlight++
				pending++
				if rng.IntN(3) != 0 { // a third of the sends are lost
					sends = append(sends, [2]any{sender, seq})
				}
			}
		}
		if pending == 0 {
			break
		}
		rng.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })
		for _, m := range sends {
			send(m[0].(string), m[1].(int64), strconv.FormatInt(m[1].(int64), 10))
		}
		time.Sleep(30 * time.Millisecond)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := broker.WaitIdle(waitCtx); err != nil {
		t.Fatal(err)
	}

	// Every message applied exactly once, and in its sender's order.
	rows, err := pool.Query(ctx, `SELECT sender, seq FROM effects ORDER BY applied`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	var sender string
	var seq int64
	n := 0
	if _, err := pgx.ForEachRow(rows, []any{&sender, &seq}, func() error {
		n++
		if seq != last[sender]+1 {
			t.Errorf("%s#%d applied after %s#%d", sender, seq, sender, last[sender])
		}
		last[sender] = max(last[sender], seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != producers*lastSeq {
		t.Errorf("%d effects, want %d", n, producers*lastSeq)
	}
	m := marks(t, pool, "marks")
	if len(m) != producers {
		t.Errorf("marks %v, want %d senders", m, producers)
	}
	for sender, mark := range m {
		if mark != lastSeq {
			t.Errorf("mark of %s = %d, want %d", sender, mark, lastSeq)
		}
	}
	var nParked int
	var reason, lastErr string
	if err := pool.QueryRow(ctx, `SELECT count(*), min(reason), min(last_error) FROM effectively.parked`).Scan(&nParked, &reason, &lastErr); err != nil {
		t.Fatal(err)
	}
	if nParked != 1 || reason != parked.ReasonInvalidKey || !strings.Contains(lastErr, `"7x" is not a decimal integer`) {
		t.Errorf("parked %d (%s: %s), want the malformed message", nParked, reason, lastErr)
	}
	if nParked != 1 {
		rows, _ := pool.Query(ctx, `SELECT sender, seq, reason, has_marker, attempts, last_error FROM effectively.parked`)
		for rows.Next() {
			var sender *string
			var seq *int64
			var reason, lastErr string
			var hasMarker bool
			var attempts int
			rows.Scan(&sender, &seq, &reason, &hasMarker, &attempts, &lastErr)
			t.Logf("parked: %v %v %s marker=%v attempts=%d %s", sender != nil && seq != nil, fmt.Sprint(seq), reason, hasMarker, attempts, lastErr)
		}
		rows.Close()
	}
	if st := s.Stats(); st.FarGaps != 0 || st.Gaps == 0 {
		t.Errorf("stats %+v: want gaps, all within the reorder window", st)
	}
	t.Logf("broker %+v; strategy %+v; parked: %s", broker.Stats(), s.Stats(), lastErr)
}
