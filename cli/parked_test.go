package cli_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
)

// oneBatch is a source that delivers its messages, with the refs they were
// given, as one batch, and then nothing.
type oneBatch struct {
	b       *consumer.Batch
	mu      sync.Mutex
	fetched bool
	settled chan struct{}
}

func (s *oneBatch) Fetch(ctx context.Context, _ int) (*consumer.Batch, error) {
	s.mu.Lock()
	if !s.fetched {
		s.fetched = true
		s.mu.Unlock()
		return s.b, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *oneBatch) Settle(context.Context, *consumer.Batch, []*consumer.Message, []consumer.Retry) error {
	close(s.settled)
	return nil
}

// consumeBatch runs a consumer named scope over msgs, delivered as one
// batch with the refs they carry, until the batch is settled.
func (e *env) consumeBatch(scope string, h consumer.Handler, msgs ...consumer.Message) {
	e.t.Helper()
	src := &oneBatch{b: &consumer.Batch{Lane: "l"}, settled: make(chan struct{})}
	for _, m := range msgs {
		m.Source, m.Lane, m.Attempt = "src", "l", 1
		src.b.Messages = append(src.b.Messages, &m)
	}
	s, err := idset.New(idset.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := consumer.New(e.pool, src, consumer.Config{Name: scope, Strategy: s, Handler: h, Concurrency: 1})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-src.settled:
	case <-time.After(30 * time.Second):
		e.t.Error("batch not settled")
	}
	cancel()
	if err := <-done; err != nil {
		e.t.Fatal(err)
	}
}

// Binary refs are listed quoted, so they cannot be mistaken for text refs,
// and can be selected as listed; several rows under one ref are all shown,
// with how often each was parked; nil and empty keys and payloads are told
// apart in show, in JSON, and in what a redrive hands the handler.
func TestParkedBinaryRefsNilValuesAndCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must(stock, "migrate", "--yes")
	poison := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.Permanent(errMsg("poison"))
	}
	e.consumeBatch("ledger", poison,
		consumer.Message{ID: "tomb", Ref: "r\xff", Key: []byte("acct"), Value: nil},
		consumer.Message{ID: "empty", Ref: "r\xfe", Key: []byte{}, Value: []byte{}},
		consumer.Message{Ref: "r\xff", Value: []byte("keyless")},
		consumer.Message{Ref: "r\xff", Value: []byte("keyless")}, // the same delivery again
		consumer.Message{ID: "text", Ref: `plain"ref`, Value: []byte("t")},
	)

	r := e.must(stock, "parked", "list", "--scope", "ledger")
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if len(lines) != 5 || !strings.Contains(lines[0], "COUNT") {
		t.Fatalf("list: want a header with COUNT and 4 rows:\n%s", r.out)
	}
	for i, want := range []*regexp.Regexp{
		regexp.MustCompile(`permanent +1 +1 .*"r\\xff" +tomb`),
		regexp.MustCompile(`permanent +1 +1 .*"r\\xfe" +empty`),
		regexp.MustCompile(`invalid_key +1 +2 .*"r\\xff" +-`),
		regexp.MustCompile(`permanent +1 +1 .*"plain\\"ref" +text`),
	} {
		if !want.MatchString(lines[i+1]) {
			t.Errorf("list row %d does not match %s:\n%s", i, want, r.out)
		}
	}
	r = e.must(stock, "parked", "list", "--ref", `"r\xff"`)
	if n := strings.Count(r.out, "\n"); n != 3 {
		t.Fatalf(`list --ref "r\xff": want 2 rows:\n%s`, r.out)
	}
	r = e.must(stock, "parked", "list", "--ref", `plain"ref`)
	if n := strings.Count(r.out, "\n"); n != 2 {
		t.Fatalf(`list --ref of a text ref: want 1 row:\n%s`, r.out)
	}
	if _, err := e.run(stock, "", "parked", "list", "--ref", `"unterminated`); err == nil || !strings.Contains(err.Error(), "--ref") {
		t.Fatalf("bad --ref: %v", err)
	}

	var all []cli.ParkedMessage
	r = e.must(stock, "parked", "list", "--json")
	if err := json.Unmarshal([]byte(r.out), &all); err != nil || len(all) != 4 {
		t.Fatalf("list --json: %v\n%s", err, r.out)
	}
	tomb, empty, keyless := all[0], all[1], all[2]
	if tomb.Ref != `"r\xff"` || tomb.RefBase64 != base64.StdEncoding.EncodeToString([]byte("r\xff")) || !tomb.PayloadNull || tomb.KeyNull || tomb.Key != "acct" {
		t.Errorf("tombstone in JSON: %+v", tomb)
	}
	if empty.PayloadNull || empty.KeyNull || empty.Payload != "" || empty.Key != "" || empty.RefBase64 == "" {
		t.Errorf("empty message in JSON: %+v", empty)
	}
	if keyless.ParkCount != 2 || keyless.Reason != "invalid_key" || all[3].RefBase64 != "" || all[3].Ref != `plain"ref` {
		t.Errorf("counted and text rows in JSON: %+v / %+v", keyless, all[3])
	}

	r = e.must(stock, "parked", "show", fmt.Sprint(tomb.ID), fmt.Sprint(empty.ID), fmt.Sprint(keyless.ID))
	shows := strings.Split(r.out, "\n\n")
	if len(shows) != 3 {
		t.Fatalf("show of three rows:\n%s", r.out)
	}
	for i, want := range [][]string{
		{`ref: +"r\\xff"`, `payload \(null\):`, `key: +acct`},
		{`ref: +"r\\xfe"`, `payload \(empty\):`, `key \(empty\):`},
		{`park count: +2`, `key \(null\):`, `payload: +keyless`},
	} {
		for _, w := range want {
			if !regexp.MustCompile(`(?m)^` + w).MatchString(shows[i]) {
				t.Errorf("show %d lacks %s:\n%s", i, w, shows[i])
			}
		}
	}

	// Redrive the rows of one binary ref: the handler gets the exact ref,
	// and the tombstone as nil.
	type got struct {
		ref      string
		valueNil bool
	}
	var mu sync.Mutex
	var seen []got
	ops := cli.Options{Handlers: map[string]consumer.Handler{"ledger": func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, got{m.Ref, m.Value == nil})
		return nil
	}}}
	r = e.must(ops, "parked", "redrive", "--scope", "ledger", "--handler", "ledger", "--ref", `"r\xff"`, "--key", "id", "--yes")
	if !strings.Contains(r.out, "applied 1,") || !strings.Contains(r.out, "skipped 1") || !strings.Contains(r.out, `"r\xff"`) {
		t.Fatalf("redrive --ref:\n%s", r.out)
	}
	if len(seen) != 1 || seen[0].ref != "r\xff" || !seen[0].valueNil {
		t.Fatalf("redrive handed the handler %+v, want the tombstone with ref r\\xff", seen)
	}
	r = e.must(stock, "parked", "purge", "--ref", `"r\xff"`, "--yes")
	if !strings.Contains(r.out, "purged 1") || e.count(`SELECT count(*) FROM effectively.parked`) != 2 {
		t.Fatalf("purge --ref: %s", r.out)
	}
}
