package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/sources/kafka"
	kafkago "github.com/segmentio/kafka-go"
)

func (e *kenv) replayArgs(group string, args ...string) []string {
	return append([]string{"replay", "--brokers", strings.Join(e.k.Brokers(), ","), "--group", group, "--topic", e.topic}, args...)
}

// A group with no stored offsets and no members is refused, naming the
// groups that have offsets for the topic and the flag that allows a new
// group; nothing is written. A dry run says the same as a warning.
func TestReplayRefusesUnknownGroup(t *testing.T) {
	t.Parallel()
	e := newKenv(t, 2)
	key := func(i int) string { return fmt.Sprintf("k-%d", i) }
	e.produce(0, 10, time.Now(), key, nil)
	e.drain(insertEffect)

	_, err := e.run(stock, "", e.replayArgs("nosuchgroup", "--to-offset", "0", "--yes")...)
	if err == nil || !strings.Contains(err.Error(), "--new-group") || !strings.Contains(err.Error(), e.group) ||
		!strings.Contains(err.Error(), `group "nosuchgroup" has no offsets stored`) {
		t.Fatalf("replay of a group that never ran: %v", err)
	}
	if n := e.count(`SELECT count(*) FROM effectively.kafka_offsets WHERE group_id = 'nosuchgroup'`); n != 0 {
		t.Fatalf("the refused replay wrote %d rows", n)
	}

	r := e.must(stock, e.replayArgs("nosuchgroup", "--to-offset", "0", "--scope", "ledger", "--dry-run", "--json")...)
	var rep cli.DryRunReport
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "--new-group") || !strings.Contains(r.err, "warning: group \"nosuchgroup\"") {
		t.Fatalf("dry run of a group that never ran: warnings %q, stderr %q", rep.Warnings, r.err)
	}

	e.must(stock, e.replayArgs("nosuchgroup", "--to-offset", "0", "--new-group", "--yes")...)
	if n := e.count(`SELECT count(*) FROM effectively.kafka_offsets WHERE group_id = 'nosuchgroup' AND next_offset = 0`); n != 2 {
		t.Fatalf("replay --new-group: %d rows at offset 0, want 2", n)
	}
}

// The plan counts the messages the replay delivers again (from the target
// to the stored offset) apart from the group's lag after them; the dry run
// reads both.
func TestReplayPlanCountsWhatIsDeliveredAgain(t *testing.T) {
	t.Parallel()
	e := newKenv(t, 2)
	key := func(i int) string { return fmt.Sprintf("k-%d", i) }
	e.produce(0, 20, time.Now(), key, nil)
	e.drain(insertEffect) // stored at 10 on each partition
	e.produce(20, 50, time.Now(), key, nil)

	rep := e.dryRun("--to-offset", "2")
	for _, p := range rep.Plan {
		if p.Stored == nil || *p.Stored != 10 || p.End != 25 || p.Target != 2 || p.Messages != 8 || p.Lag != 15 {
			t.Fatalf("plan: %+v, want 8 messages again from 2 to the stored 10, then a lag of 15", p)
		}
	}
	if rep.Total.Messages != 46 || rep.Total.Applied != 16 || rep.Total.New != 30 {
		t.Fatalf("dry run: %+v, want 46 read: 16 applied, 30 new", rep.Total)
	}
	if len(rep.Warnings) != 0 {
		t.Fatalf("dry run warned: %q", rep.Warnings)
	}

	r, err := e.run(cli.Options{AssumeTerminal: true}, "n\n", e.replayArgs(e.group, "--to-offset", "2")...)
	if err == nil || !strings.Contains(r.err, "16 message(s) are delivered again (and then the 30 of its lag)") {
		t.Fatalf("the question: %v\n%s", err, r.err)
	}
	if !strings.Contains(r.out, "16 message(s) delivered again") {
		t.Fatalf("the plan:\n%s", r.out)
	}
}

// A dry run whose key setting finds none of the markers of the messages
// the group consumed warns, and names the key setting that finds them; a
// scope without markers is named as such.
func TestReplayDryRunWarnsOnKeyWithoutMarkers(t *testing.T) {
	t.Parallel()
	e := newKenv(t, 1)
	var msgs []kafkago.Message
	for i := range 30 {
		msgs = append(msgs, kafkago.Message{
			Value:   fmt.Appendf(nil, `{"event_id":"e-%d","amount":%d}`, i, 1000+i),
			Headers: []kafkago.Header{{Key: kafka.DefaultIDHeader, Value: fmt.Appendf(nil, "k-%d", i)}},
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.k.Produce(ctx, e.topic, msgs...); err != nil {
		t.Fatal(err)
	}
	e.drain(insertEffect) // keyed by the idempotency-key header

	r := e.must(stock, e.replayArgs(e.group, "--to-offset", "0", "--scope", "ledger", "--dry-run", "--key", "json:event_id")...)
	if !strings.Contains(r.err, "warning: none of the 30 message(s) the group consumed") ||
		!strings.Contains(r.err, "--key json:event_id") ||
		!strings.Contains(r.err, "match --key id --id-header idempotency-key: it finds a marker for 30 of 30") {
		t.Fatalf("dry run with a key that finds no marker: stderr\n%s", r.err)
	}

	rep := e.dryRun("--to-offset", "0")
	if len(rep.Warnings) != 0 || rep.Total.Applied != 30 {
		t.Fatalf("dry run with the consumers' key: %+v, warnings %q", rep.Total, rep.Warnings)
	}

	r = e.must(stock, e.replayArgs(e.group, "--to-offset", "0", "--scope", "nosuch", "--dry-run")...)
	if !strings.Contains(r.err, `warning: scope "nosuch" has no markers`) {
		t.Fatalf("dry run in a scope without markers: stderr\n%s", r.err)
	}
}

// A group whose offsets are committed to Kafka only (its consumers run
// with KafkaOffsetsOnly) is refused with what to use instead.
func TestReplayRefusesKafkaOffsetsOnlyGroup(t *testing.T) {
	t.Parallel()
	e := newKenv(t, 1)
	e.produce(0, 5, time.Now(), func(i int) string { return fmt.Sprintf("k-%d", i) }, nil)
	c := &kafkago.Client{Addr: kafkago.TCP(e.k.Brokers()...), Timeout: 10 * time.Second}
	resp, err := c.OffsetCommit(context.Background(), &kafkago.OffsetCommitRequest{
		GroupID: "kafka-only", GenerationID: -1,
		Topics: map[string][]kafkago.OffsetCommit{e.topic: {{Partition: 0, Offset: 5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				t.Fatal(p.Error)
			}
		}
	}
	_, err = e.run(stock, "", e.replayArgs("kafka-only", "--to-offset", "0", "--yes")...)
	if err == nil || !strings.Contains(err.Error(), "KafkaOffsetsOnly") || !strings.Contains(err.Error(), "--reset-offsets") {
		t.Fatalf("replay of a group with offsets in Kafka only: %v", err)
	}
	if n := e.count(`SELECT count(*) FROM effectively.kafka_offsets WHERE group_id = 'kafka-only'`); n != 0 {
		t.Fatalf("the refused replay wrote %d rows", n)
	}
}
