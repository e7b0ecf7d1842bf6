package sourcetest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/sourcetest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A wrapped source: the test broker with optional interfaces added, kept
// or broken, and the subtests of the suite that must fail for it (none for
// a sound one, which must pass them all).
type wrapped struct {
	wrap    func(*consumertest.Broker) consumer.Source
	db      bool // Broker.DB is a fresh database
	exhaust int  // Harness.ExhaustedAfter
	catches []string
}

var wrappers = map[string]wrapped{
	// Every optional interface that needs no database, kept.
	"sound": {wrap: func(b *consumertest.Broker) consumer.Source { return sound{b} }},
	// ParkExhausted false, on a broker that moves a message aside once it
	// was delivered three times.
	"redriving": {wrap: func(b *consumertest.Broker) consumer.Source { return redriving{b} }, exhaust: 3},
	// A Migrator whose line creates a table, kept.
	"migrating": {wrap: func(b *consumertest.Broker) consumer.Source { return migrating{b} }, db: true},
	// A horizon lookup that ignores its context.
	"deaf": {wrap: func(b *consumertest.Broker) consumer.Source { return deaf{b} }, catches: []string{"HorizonSource"}},
	// A horizon that grows at every call.
	"drifting": {wrap: func(b *consumertest.Broker) consumer.Source { return &drifting{Broker: b} }, catches: []string{"HorizonSource"}},
	// A horizon of zero.
	"horizonless": {wrap: func(b *consumertest.Broker) consumer.Source { return horizonless{b} }, catches: []string{"HorizonSource"}},
	// A negative content-ID window.
	"negative": {wrap: func(b *consumertest.Broker) consumer.Source { return negative{b} }, catches: []string{"ContentIDSource"}},
	// A content-ID window that changes.
	"fickle": {wrap: func(b *consumertest.Broker) consumer.Source { return &fickle{Broker: b} }, catches: []string{"ContentIDSource", "ExhaustionSource"}},
	// ParkExhausted false, on a broker that never moves a message aside.
	"undying": {wrap: func(b *consumertest.Broker) consumer.Source { return undying{b} }, exhaust: 3, catches: []string{"ExhaustionSource"}},
	// Migration lines renamed at every call, so they apply again.
	"renaming": {wrap: func(b *consumertest.Broker) consumer.Source { return &renaming{Broker: b} }, db: true, catches: []string{"Migrator"}},
	// A migration that does not apply.
	"unparsable": {wrap: func(b *consumertest.Broker) consumer.Source { return unparsable{b} }, db: true, catches: []string{"Migrator"}},
	// A TxSource that writes nothing in the transaction.
	"txless": {wrap: func(b *consumertest.Broker) consumer.Source { return txless{b} }, db: true, catches: []string{"TxSourceCommitted"}},
	// A TxSource that acknowledges at BeforeCommit, outside the transaction.
	"eager": {wrap: func(b *consumertest.Broker) consumer.Source { return eager{b} }, db: true, catches: []string{"TxSourceRolledBack"}},
}

// TestSuiteCatchesBrokenSources runs the suite against every wrapped source
// in a child process and checks that it passes the sound ones and that the
// subtests each broken one must fail fail.
func TestSuiteCatchesBrokenSources(t *testing.T) {
	if os.Getenv("SOURCETEST_WRAPPED") != "" {
		t.Skip("child process")
	}
	server := pgtest.Server(t)
	for name, w := range wrappers {
		run := func(t *testing.T, pattern string) (string, error) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestWrapped$/"+pattern, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "SOURCETEST_WRAPPED="+name, "TEST_DATABASE_URL="+server)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if len(w.catches) == 0 {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				out, err := run(t, "")
				if err != nil {
					t.Fatalf("the suite failed the sound source %q:\n%s", name, out)
				}
				for _, sub := range []string{"HorizonSource", "ContentIDSource", "ExhaustionSource", "Migrator"} {
					if wantSub(name, sub) && !strings.Contains(out, "--- PASS: TestWrapped/"+sub) {
						t.Errorf("source %q: subtest %s did not run and pass:\n%s", name, sub, out)
					}
				}
			})
			continue
		}
		for _, sub := range w.catches {
			t.Run(name+"/"+sub, func(t *testing.T) {
				t.Parallel()
				out, err := run(t, "^"+sub+"$")
				if err == nil {
					t.Fatalf("the suite passed source %q; subtest %s should have failed:\n%s", name, sub, out)
				}
				if !strings.Contains(out, "--- FAIL: TestWrapped/"+sub) {
					t.Fatalf("source %q: subtest %s did not fail:\n%s", name, sub, out)
				}
			})
		}
	}
}

// wantSub says which subtests a sound source must pass rather than skip.
func wantSub(name, sub string) bool {
	switch name {
	case "migrating":
		return sub == "Migrator"
	case "redriving":
		return sub == "ExhaustionSource"
	}
	return sub == "HorizonSource" || sub == "ContentIDSource"
}

// TestWrapped runs the suite against the source named by
// SOURCETEST_WRAPPED, in the child process.
func TestWrapped(t *testing.T) {
	name := os.Getenv("SOURCETEST_WRAPPED")
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenSources")
	}
	w, ok := wrappers[name]
	if !ok {
		t.Fatalf("unknown wrapped source %q", name)
	}
	const lanes = 3
	sourcetest.Run(t, sourcetest.Harness{
		Lanes:          lanes,
		ExhaustedAfter: w.exhaust,
		New: func(t *testing.T) *sourcetest.Broker {
			b := consumertest.New(consumertest.Config{Lanes: lanes})
			src := w.wrap(b)
			opened := false
			sb := &sourcetest.Broker{
				Publish: func(_ *testing.T, lane int, msgs ...sourcetest.Message) {
					for _, m := range msgs {
						b.Publish(lane, consumer.Message{ID: m.Tag(), Value: m.Value, Headers: m.Headers})
					}
				},
				Open: func(*testing.T) consumer.Source {
					if opened {
						b.Crash()
					}
					opened = true
					return src
				},
				LoseLanes: func(*testing.T, consumer.Source) { b.Crash() },
			}
			if w.db {
				sb.DB = pgtest.NewPool(t)
			}
			return sb
		},
		Features: sourcetest.Features{NilValues: true, BinaryValues: true, AttemptsSurviveRestart: true},
	})
}

// sound keeps the promises of the optional interfaces that need no
// database.
type sound struct{ *consumertest.Broker }

func (sound) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	return 24 * time.Hour, ctx.Err()
}
func (sound) ContentIDWindow() time.Duration { return 0 }
func (sound) ParkExhausted() bool            { return true }

type migrating struct{ *consumertest.Broker }

func (migrating) Migrations() []pg.Line {
	return []pg.Line{{Name: "sourcetest:sound", FS: fstest.MapFS{
		"001_create.sql": {Data: []byte("CREATE TABLE sourcetest_sound (x int);")},
	}}}
}

// redriving's broker takes a message aside (acknowledges it) when it is
// handed back after its third delivery.
type redriving struct{ *consumertest.Broker }

func (redriving) ParkExhausted() bool { return false }

func (r redriving) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	var keep []consumer.Retry
	for _, rt := range retry {
		if rt.Message.Attempt >= 3 {
			ack = append(slices.Clip(ack), rt.Message)
		} else {
			keep = append(keep, rt)
		}
	}
	return r.Broker.Settle(ctx, b, ack, keep)
}

type deaf struct{ *consumertest.Broker }

func (deaf) RedeliveryHorizon(context.Context) (time.Duration, error) { select {} }

type drifting struct {
	*consumertest.Broker
	n atomic.Int64
}

func (d *drifting) RedeliveryHorizon(context.Context) (time.Duration, error) {
	return time.Duration(d.n.Add(1)) * time.Hour, nil
}

type horizonless struct{ *consumertest.Broker }

func (horizonless) RedeliveryHorizon(context.Context) (time.Duration, error) { return 0, nil }

type negative struct{ *consumertest.Broker }

func (negative) ContentIDWindow() time.Duration { return -time.Minute }

type fickle struct {
	*consumertest.Broker
	n atomic.Int64
}

func (f *fickle) ContentIDWindow() time.Duration { return time.Duration(f.n.Add(1)%2) * time.Minute }
func (f *fickle) ParkExhausted() bool            { return f.n.Add(1)%2 == 0 }

type undying struct{ *consumertest.Broker }

func (undying) ParkExhausted() bool { return false }

type renaming struct {
	*consumertest.Broker
	n atomic.Int64
}

func (r *renaming) Migrations() []pg.Line {
	return []pg.Line{{Name: "sourcetest:renaming" + string(rune('a'+r.n.Add(1)%26)), FS: fstest.MapFS{
		"001_create.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS sourcetest_renaming (x int);")},
	}}}
}

type unparsable struct{ *consumertest.Broker }

func (unparsable) Migrations() []pg.Line {
	return []pg.Line{{Name: "sourcetest:unparsable", FS: fstest.MapFS{
		"001_create.sql": {Data: []byte("CREATE TABEL sourcetest_unparsable (x int);")},
	}}}
}

type txless struct{ *consumertest.Broker }

func (txless) BeforeCommit(context.Context, pgx.Tx, *consumer.Batch, []*consumer.Message) error {
	return nil
}

type eager struct{ *consumertest.Broker }

func (e eager) BeforeCommit(ctx context.Context, _ pgx.Tx, b *consumer.Batch, ack []*consumer.Message) error {
	if len(ack) == 0 {
		return nil
	}
	if err := e.Settle(ctx, b, ack, nil); err != nil {
		return errors.Join(err, consumer.ErrFenced)
	}
	return nil
}
