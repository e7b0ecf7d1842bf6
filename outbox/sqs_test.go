package outbox

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

func sqsSink(t *testing.T, c *awssqs.Client, url string) *SQSSink {
	t.Helper()
	s, err := NewSQSSink(c, url)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// receiveAll receives from url until it has n messages, deleting each, and
// returns them in the order received.
func receiveAll(t *testing.T, c *awssqs.Client, url string, n int) []types.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got []types.Message
	for len(got) < n {
		out, err := c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatalf("after %d messages: %v", len(got), err)
		}
		for _, m := range out.Messages {
			got = append(got, m)
			if _, err := c.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return got
}

func attr(m types.Message, name string) []byte {
	v, ok := m.MessageAttributes[name]
	if !ok {
		return nil
	}
	if v.StringValue != nil {
		return []byte(*v.StringValue)
	}
	return v.BinaryValue
}

// TestSQSSink: through fauxqs, a standard queue gets the body byte for
// byte, the ID in the idempotency-key attribute and headers as String or
// Binary attributes; a FIFO queue gets the key as MessageGroupId and the ID
// (or, when it does not fit, its hash) as MessageDeduplicationId. What SQS
// cannot carry (nil or empty value, non-text value, more than 256 KiB, bad
// attribute names, a nil key on a FIFO queue) and a queue that does not
// exist are parked with the reason, each holding back only its key.
func TestSQSSink(t *testing.T) {
	if _, err := NewSQSSink(nil, "u"); err == nil {
		t.Fatal("a nil client was accepted")
	}
	db, o := setup(t, Config{Mode: TableMode})
	c := fauxqs.Client(t)
	std := fauxqs.NewQueue(t, c, "outbox", nil)
	fifo := fauxqs.NewQueue(t, c, "outbox.fifo", nil)
	missing := strings.TrimSuffix(std, "/"+std[strings.LastIndex(std, "/")+1:]) + "/no-such-queue"
	ctx := context.Background()

	binary := []byte{0, 1, 2, 0xff}
	text := "hello\tworld, ünïcode ✓"
	longID := strings.Repeat("id with spaces ", 20)
	emit(t, db, o,
		Message{Sink: "std", Key: []byte("a"), Value: []byte(text), ID: "s1",
			Headers: []Header{{Key: "t", Value: []byte("v")}, {Key: "bin.ary", Value: binary}}},
		Message{Sink: "std", Key: []byte("nil"), Value: nil, ID: "s-nil"},
		Message{Sink: "std", Key: []byte("nil"), Value: []byte("after"), ID: "s-after"},
		Message{Sink: "std", Key: []byte("empty"), Value: []byte{}, ID: "s-empty"},
		Message{Sink: "std", Key: []byte("big"), Value: bytes.Repeat([]byte("x"), SQSMaxSize), ID: "s-big"},
		Message{Sink: "std", Key: []byte("bin"), Value: binary, ID: "s-bin"},
		Message{Sink: "std", Key: []byte("hdr"), Value: []byte("v"), ID: "s-hdr", Headers: []Header{{Key: "AWS.x", Value: []byte("v")}}},
		Message{Sink: "std", Key: []byte("hnil"), Value: []byte("v"), ID: "s-hnil", Headers: []Header{{Key: "h", Value: nil}}},
		Message{Sink: "std", Key: nil, Value: []byte("no key"), ID: "s7"},
		Message{Sink: "fifo", Key: []byte("k1"), Value: []byte("v1"), ID: "f1"},
		Message{Sink: "fifo", Key: []byte("k1"), Value: []byte("v2"), ID: longID},
		Message{Sink: "fifo", Key: nil, Value: []byte("v"), ID: "f-nil"},
		Message{Sink: "fifo", Key: []byte("k 2"), Value: []byte("v"), ID: "f-space"},
		Message{Sink: "missing", Key: []byte("m"), Value: []byte("v"), ID: "m1"},
	)
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{
		"std": sqsSink(t, c, std), "fifo": sqsSink(t, c, fifo), "missing": sqsSink(t, c, missing),
	}})
	want := map[string]string{
		"s-nil":   "nil or empty value",
		"s-empty": "nil or empty value",
		"s-big":   "over SQS's 262144",
		"s-bin":   "SQS bodies are text",
		"s-hdr":   "reserved by SQS",
		"s-hnil":  "empty attribute values",
		"f-nil":   "nil key on a FIFO queue",
		"f-space": "not a MessageGroupId",
		"m1":      "",
	}
	waitRows(t, db, 2*time.Minute, len(want), `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL`)
	waitRows(t, db, 2*time.Minute, 4, `SELECT count(*) FROM effectively.outbox WHERE published_at IS NOT NULL`)
	parked, err := o.Parked(ctx, db, 20)
	if err != nil || len(parked) != len(want) {
		t.Fatalf("parked %+v %v", parked, err)
	}
	for _, p := range parked {
		w, ok := want[p.Message.ID]
		if !ok || !strings.Contains(p.Reason, w) {
			t.Errorf("%s parked with %q, want %q", p.Message.ID, p.Reason, w)
		}
		t.Logf("parked %s: %s", p.Message.ID, p.Reason)
	}
	var waiting int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM effectively.outbox WHERE msg_id = 's-after' AND published_at IS NULL AND parked_at IS NULL`).Scan(&waiting); err != nil || waiting != 1 {
		t.Fatalf("s-after should wait behind s-nil: %d %v", waiting, err)
	}

	got := receiveAll(t, c, std, 2)
	byID := map[string]types.Message{}
	for _, m := range got {
		byID[string(attr(m, sqs.DefaultIDAttribute))] = m
	}
	s1, s7 := byID["s1"], byID["s7"]
	if aws.ToString(s1.Body) != text || string(attr(s1, "t")) != "v" || !bytes.Equal(attr(s1, "bin.ary"), binary) ||
		aws.ToString(s1.MessageAttributes["bin.ary"].DataType) != "Binary" || len(s1.MessageAttributes) != 3 ||
		aws.ToString(s7.Body) != "no key" {
		t.Fatalf("standard queue received %+v", got)
	}

	got = receiveAll(t, c, fifo, 2)
	sys := func(m types.Message, a types.MessageSystemAttributeName) string { return m.Attributes[string(a)] }
	if aws.ToString(got[0].Body) != "v1" || aws.ToString(got[1].Body) != "v2" ||
		sys(got[0], types.MessageSystemAttributeNameMessageGroupId) != "k1" ||
		sys(got[1], types.MessageSystemAttributeNameMessageGroupId) != "k1" ||
		sys(got[0], types.MessageSystemAttributeNameMessageDeduplicationId) != "f1" ||
		sys(got[1], types.MessageSystemAttributeNameMessageDeduplicationId) != SQSDeduplicationID(longID) ||
		!strings.HasPrefix(SQSDeduplicationID(longID), "sha256-") || string(attr(got[1], sqs.DefaultIDAttribute)) != longID {
		t.Fatalf("FIFO queue received %+v", got)
	}
}

// TestSQSSinkBatches: one Publish of more than ten messages goes out in
// groups of ten, and one of more than SQSMaxSize in all is split by size.
func TestSQSSinkBatches(t *testing.T) {
	c := fauxqs.Client(t)
	url := fauxqs.NewQueue(t, c, "batches", nil)
	s := sqsSink(t, c, url)
	var msgs []Message
	for i := range 25 {
		v := bytes.Repeat([]byte{'a' + byte(i)}, 60<<10) // 60 KiB: four to a request at most
		msgs = append(msgs, Message{Key: []byte("k"), Value: v, ID: "b" + string(rune('a'+i))})
	}
	if err := s.Publish(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	if got := receiveAll(t, c, url, 25); len(got) != 25 {
		t.Fatalf("received %d", len(got))
	}
}

// TestSQSRules: what SQSSink refuses before sending, at SQS's limits.
func TestSQSRules(t *testing.T) {
	s := &SQSSink{fifo: true}
	ok := Message{Key: []byte("k"), Value: []byte("v"), ID: "id"}
	with := func(f func(*Message)) Message { m := ok; f(&m); return m }
	nine := make([]Header, 9)
	for i := range nine {
		nine[i] = Header{Key: "h" + strconv.Itoa(i), Value: []byte("v")}
	}
	for _, tc := range []struct {
		m    Message
		want string // "" when accepted
	}{
		{ok, ""},
		{with(func(m *Message) { m.Headers = nine }), ""},
		{with(func(m *Message) { m.Headers = append(nine, Header{Key: "h9", Value: []byte("v")}) }), "10 headers"},
		{with(func(m *Message) { m.Key = bytes.Repeat([]byte("k"), 128) }), ""},
		{with(func(m *Message) { m.Key = bytes.Repeat([]byte("k"), 129) }), "not a MessageGroupId"},
		{with(func(m *Message) { m.Key = []byte("ké") }), "not a MessageGroupId"},
		{with(func(m *Message) { m.Value = []byte{0xff} }), "not valid UTF-8"},
		{with(func(m *Message) { m.Value = []byte("a\x01") }), "U+0001"},
		{with(func(m *Message) { m.Value = []byte("\t\r\n \U0010FFFF") }), ""},
		{with(func(m *Message) { m.Value = bytes.Repeat([]byte("x"), SQSMaxSize-200) }), ""},
		{with(func(m *Message) { m.Headers = []Header{{Key: "a..b", Value: []byte("v")}} }), "double period"},
		{with(func(m *Message) { m.Headers = []Header{{Key: "amazon.x", Value: []byte("v")}} }), "reserved"},
		{with(func(m *Message) { m.Headers = []Header{{Key: "a b", Value: []byte("v")}} }), "made of"},
		{with(func(m *Message) { m.Headers = []Header{{Key: "h", Value: []byte("v")}, {Key: "h", Value: []byte("w")}} }), "twice"},
		{with(func(m *Message) { m.ID = "a\x01" }), "ID"},
	} {
		_, _, err := s.entry(&tc.m)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v refused: %v", tc.m.Headers, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("key %q: got %v, want an error with %q", tc.m.Key, err, tc.want)
		}
	}
	long := strings.Repeat("x", 128)
	if SQSDeduplicationID(long) != long || SQSDeduplicationID(long+"x") == long+"x" || len(SQSDeduplicationID(long+"x")) > 128 ||
		SQSDeduplicationID("a b") == SQSDeduplicationID("a c") {
		t.Fatal("SQSDeduplicationID keeps IDs that fit and hashes those that do not, apart")
	}
}

// TestSQSSinkHoldsKey: once a message of a key fails, the key's later
// messages of the same Publish are not sent; other keys are.
func TestSQSSinkHoldsKey(t *testing.T) {
	c := fauxqs.Client(t)
	url := fauxqs.NewQueue(t, c, "hold", nil)
	s := sqsSink(t, c, url)
	var msgs []Message
	for i := range 12 { // the refused one in the first request, the held ones in both
		k := []byte("other")
		if i%2 == 0 {
			k = []byte("k")
		}
		msgs = append(msgs, Message{Key: k, Value: []byte("v" + strconv.Itoa(i)), ID: "h" + strconv.Itoa(i)})
	}
	msgs[2].Value = nil
	err := s.Publish(context.Background(), msgs)
	var pe PublishErrors
	if !errors.As(err, &pe) || len(pe) != 5 || !IsPermanent(pe[2]) {
		t.Fatalf("Publish: %v", err)
	}
	for i := 4; i < 12; i += 2 {
		if pe[i] == nil || IsPermanent(pe[i]) {
			t.Fatalf("message %d of the failed key: %v, want a transient error", i, pe[i])
		}
	}
	got := receiveAll(t, c, url, 7)
	ids := map[string]bool{}
	for _, m := range got {
		ids[string(attr(m, sqs.DefaultIDAttribute))] = true
	}
	for _, id := range []string{"h0", "h1", "h3", "h5", "h7", "h9", "h11"} {
		if !ids[id] {
			t.Fatalf("received %v, want %s among them", ids, id)
		}
	}
}
