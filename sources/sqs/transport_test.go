package sqs_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/effectively-once/effectively/internal/fauxqs"
)

// wire is an http.RoundTripper in front of the real transport to the SQS
// emulator, for the faults of a real network: it can drop a kind of call
// (the request never reaches the emulator) or hold a call back until
// released. It does not answer for the emulator.
type wire struct {
	base http.RoundTripper

	drop atomic.Value // string: the operation to drop ("DeleteMessageBatch"), or ""

	mu       sync.Mutex
	slow     func(body string) bool                 // which received messages' renewals to hold back
	handles  map[string]bool                        // receipt handles of those messages
	handleOf map[string]string                      // body → receipt handle of its latest receive
	held     chan struct{}                          // closed by release
	onCall   func(op string, req []byte, err error) // after every call
}

// newWire returns a client of the emulator whose calls go through a wire.
func newWire(tb testing.TB) (*awssqs.Client, *wire) {
	tb.Helper()
	w := &wire{base: http.DefaultTransport.(*http.Transport).Clone(), handles: map[string]bool{}, handleOf: map[string]string{}, held: make(chan struct{})}
	w.drop.Store("")
	c := awssqs.New(awssqs.Options{
		Region:       fauxqs.Region,
		BaseEndpoint: aws.String(fauxqs.Endpoint(tb)),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   &http.Client{Transport: w},
	})
	tb.Cleanup(w.release)
	return c, w
}

var errDropped = errors.New("test network: request dropped")

// operation is the SQS operation of a JSON-protocol request.
func operation(r *http.Request) string {
	t := r.Header.Get("X-Amz-Target")
	return t[strings.LastIndexByte(t, '.')+1:]
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	op := operation(r)
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return nil, err
		}
		_ = r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	if op == w.drop.Load().(string) {
		w.called(op, body, errDropped)
		return nil, errDropped
	}
	if op == "ChangeMessageVisibilityBatch" && w.holds(body) {
		w.mu.Lock()
		held := w.held
		w.mu.Unlock()
		select {
		case <-held:
		case <-r.Context().Done():
			w.called(op, body, r.Context().Err())
			return nil, r.Context().Err()
		}
	}
	resp, err := w.base.RoundTrip(r)
	if err == nil && op == "ReceiveMessage" {
		err = w.noteReceived(resp)
	}
	w.called(op, body, err)
	return resp, err
}

func (w *wire) called(op string, body []byte, err error) {
	w.mu.Lock()
	f := w.onCall
	w.mu.Unlock()
	if f != nil {
		f(op, body, err)
	}
}

// holds reports whether a renewal request names a message to hold back.
func (w *wire) holds(body []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for h := range w.handles {
		if bytes.Contains(body, []byte(h)) {
			return true
		}
	}
	return false
}

// noteReceived remembers the receipt handles of received messages (and
// which ones' renewals to hold back), and gives the response its body back.
func (w *wire) noteReceived(resp *http.Response) error {
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return err
	}
	var out struct {
		Messages []struct{ Body, ReceiptHandle string }
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil // not for us to judge
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range out.Messages {
		w.handleOf[m.Body] = m.ReceiptHandle
		if w.slow != nil && w.slow(m.Body) {
			w.handles[m.ReceiptHandle] = true
		}
	}
	return nil
}

// handle returns the receipt handle of the latest receive of the message
// with body.
func (w *wire) handle(body string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.handleOf[body]
}

// holdRenewals holds back every visibility renewal of a message whose body
// satisfies slow, received from now on, until release.
func (w *wire) holdRenewals(slow func(body string) bool) {
	w.mu.Lock()
	w.slow = slow
	w.mu.Unlock()
}

// release lets held calls through; later ones are no longer held.
func (w *wire) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.held:
	default:
		close(w.held)
	}
}

// watch calls f after every call made through w.
func (w *wire) watch(f func(op string, req []byte, err error)) {
	w.mu.Lock()
	w.onCall = f
	w.mu.Unlock()
}
