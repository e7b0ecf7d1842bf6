package outbox

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/childtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// logSink is a Sink that records what it publishes in a table, so that
// relays in several processes write one log: (relay, message ID) in the
// order published.
type logSink struct {
	db    *pgxpool.Pool
	relay string
}

func (s logSink) Publish(ctx context.Context, msgs []Message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	_, err := s.db.Exec(ctx, `INSERT INTO published_log (relay, msg_id)
SELECT $1, id FROM unnest($2::text[]) WITH ORDINALITY AS t(id, ord) ORDER BY ord`, s.relay, ids)
	return err
}

// TestFrozenRelayProcess: a relay in another process reads its rows and is
// frozen by SIGSTOP before it publishes them, past the end of its lease.
// Another relay takes the partitions over and publishes those rows and a
// later one of the same key. When the frozen process is continued, it
// publishes nothing: its lease ended by its own clock while it was
// stopped. The key's messages go out once each, in commit order.
func TestFrozenRelayProcess(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE published_log (n bigserial PRIMARY KEY, relay text NOT NULL, msg_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o, msg("k", "m1"), msg("k", "m2"))

	child := childtest.Start(t, "TestFrozenRelayChild", "OUTBOX_FROZEN_CHILD="+db.Config().ConnString())
	cmd := child.Cmd
	child.Expect("READ") // the child has read m1 and m2 and waits to go on
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The child's leases expire in the database; another relay takes them.
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": logSink{db, "other"}}, LeaseTTL: time.Second})
	emit(t, db, o, msg("k", "m3"))
	waitRows(t, db, 2*time.Minute, 3, `SELECT count(DISTINCT msg_id) FROM published_log WHERE relay = 'other'`)

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(child.Stdin, "GO\n"); err != nil {
		t.Fatal(err)
	}
	if l := "PASS" + child.Expect("PASS"); l != "PASS read=2 expired=2 published=0" {
		t.Fatalf("the woken relay's pass: %s", l)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child relay: %v", err)
	}

	rows, err := db.Query(ctx, `SELECT relay, msg_id FROM published_log ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	var log []string
	for rows.Next() {
		var relay, id string
		if err := rows.Scan(&relay, &id); err != nil {
			t.Fatal(err)
		}
		log = append(log, relay+":"+id)
	}
	rows.Close()
	if got := strings.Join(log, " "); got != "other:m1 other:m2 other:m3" {
		t.Fatalf("published: %s", got)
	}
}

// TestFrozenRelayChild is the relay process TestFrozenRelayProcess
// freezes; it runs only when that test starts it.
func TestFrozenRelayChild(t *testing.T) {
	dsn := os.Getenv("OUTBOX_FROZEN_CHILD")
	if dsn == "" {
		t.Skip("run by TestFrozenRelayProcess")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	in := bufio.NewReader(os.Stdin)
	first := true
	r, err := NewRelay(db, RelayConfig{
		Sinks: map[string]Sink{"s": logSink{db, "frozen"}}, Owner: "frozen", LeaseTTL: time.Second,
		PollInterval: 50 * time.Millisecond,
		Hooks: []RelayHook{passFunc(func(s *PassStats) {
			p, _, _, _ := s.Counts()
			fmt.Printf("PASS read=%d expired=%d published=%d\n", s.Read, s.Expired, p)
		})},
		beforeCheck: func() {
			if first {
				first = false
				fmt.Println("READ")
				_, _ = in.ReadString('\n')
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
}
