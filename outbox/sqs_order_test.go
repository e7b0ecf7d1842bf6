package outbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/effectively-once/effectively/internal/fauxqs"
)

// refuseEntry sits between the SDK and the emulator like a network hop and
// plays SQS refusing one entry of a SendMessageBatch while it takes the
// others: the first time a request carries an entry whose
// MessageDeduplicationId is in refuse, it removes that entry before the
// emulator sees it and reports it failed (InternalError, not the sender's
// fault) in the answer.
type refuseEntry struct {
	mu     sync.Mutex
	refuse map[string]bool
	hits   int
}

func (r *refuseEntry) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("X-Amz-Target") != "AmazonSQS.SendMessageBatch" {
		return http.DefaultTransport.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	var in map[string]any
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, err
	}
	entries, _ := in["Entries"].([]any)
	var kept []any
	var refused []map[string]any
	r.mu.Lock()
	for _, e := range entries {
		m := e.(map[string]any)
		if id, _ := m["MessageDeduplicationId"].(string); r.refuse[id] {
			delete(r.refuse, id)
			r.hits++
			refused = append(refused, map[string]any{"Id": m["Id"], "Code": "InternalError", "SenderFault": false, "Message": "refused for the test"})
			continue
		}
		kept = append(kept, e)
	}
	r.mu.Unlock()
	send := func(b []byte) (*http.Response, error) {
		out := req.Clone(req.Context())
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		out.Header.Set("Content-Length", strconv.Itoa(len(b)))
		return http.DefaultTransport.RoundTrip(out)
	}
	if len(refused) == 0 {
		return send(body)
	}
	var answer map[string]any
	if len(kept) == 0 {
		answer = map[string]any{"Successful": []any{}}
	} else {
		in["Entries"] = kept
		b, _ := json.Marshal(in)
		resp, err := send(b)
		if err != nil {
			return nil, err
		}
		rb, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			resp.Body = io.NopCloser(bytes.NewReader(rb))
			return resp, nil
		}
		if err := json.Unmarshal(rb, &answer); err != nil {
			return nil, fmt.Errorf("refuseEntry: %s: %w", rb, err)
		}
	}
	failed, _ := answer["Failed"].([]any)
	for _, f := range refused {
		failed = append(failed, f)
	}
	answer["Failed"] = failed
	b, _ := json.Marshal(answer)
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": []string{"application/x-amz-json-1.0"}, "Content-Length": []string{strconv.Itoa(len(b))}},
		Body:   io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b)), Request: req}, nil
}

// TestSQSSinkFIFOOrderWhenAnEntryIsRefused: SQS answers a SendMessageBatch
// per entry, so it may refuse one entry and take a later one of the same
// message group. On a FIFO queue the sink must not let the later one arrive
// first: each group's messages arrive in commit order.
func TestSQSSinkFIFOOrderWhenAnEntryIsRefused(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	plain := fauxqs.Client(t)
	queue := fauxqs.NewQueue(t, plain, "order.fifo", nil)
	refuser := &refuseEntry{refuse: map[string]bool{"g-02": true, "g-07": true, "h-01": true}}
	c := awssqs.New(awssqs.Options{Region: fauxqs.Region, BaseEndpoint: aws.String(fauxqs.Endpoint(t)),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""), HTTPClient: &http.Client{Transport: refuser}})

	var msgs []Message
	for i := range 12 {
		msgs = append(msgs, Message{Sink: "q", Key: []byte("g"), Value: []byte(fmt.Sprint("g ", i)), ID: fmt.Sprintf("g-%02d", i)})
		if i < 4 {
			msgs = append(msgs, Message{Sink: "q", Key: []byte("h"), Value: []byte(fmt.Sprint("h ", i)), ID: fmt.Sprintf("h-%02d", i)})
		}
	}
	emit(t, db, o, msgs...)
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"q": sqsSink(t, c, queue)}})
	waitRows(t, db, 2*time.Minute, len(msgs), `SELECT count(*) FROM effectively.outbox WHERE published_at IS NOT NULL`)
	refuser.mu.Lock()
	hits := refuser.hits
	refuser.mu.Unlock()
	if hits != 3 {
		t.Fatalf("%d entries refused, want 3", hits)
	}

	got := receiveAll(t, plain, queue, len(msgs))
	next := map[string]int{}
	for _, m := range got {
		id := string(attr(m, "idempotency-key"))
		key := id[:1]
		if want := fmt.Sprintf("%s-%02d", key, next[key]); id != want {
			t.Fatalf("group %s: %s arrived where %s was due", key, id, want)
		}
		next[key]++
	}
}
