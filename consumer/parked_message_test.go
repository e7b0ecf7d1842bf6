package consumer

import (
	"testing"

	"github.com/effectively-once/effectively/consumer/parked"
)

// A parked row is redriven as the message it was: one more attempt, its
// key, and its key, payload and headers byte for byte, nil apart from
// empty.
func TestParkedMessage(t *testing.T) {
	seq, sender := int64(7), "orders/0"
	row := parked.Row{
		Consumer: "c", Scope: "s", Sender: &sender, Seq: &seq, Fingerprint: []byte{1, 2}, HasMarker: true,
		Source: "src\xff", Lane: "lane\x00", Ref: "r\xfe", MsgKey: []byte{}, Payload: nil,
		Headers:  []parked.Header{{Key: "k\xff", Value: []byte{0}}, {Key: "n", Value: nil}, {Key: "t", Value: []byte("v")}},
		Attempts: 3, Reason: parked.ReasonMaxAttempts,
	}
	k, ok := row.DedupeKey()
	if !ok {
		t.Fatal("the row has no key")
	}
	m := parkedMessage(&row)
	if m.Attempt != 4 || m.DedupeKey.String() != k.String() || m.ID != k.ID || m.Ref != row.Ref || m.Value != nil {
		t.Errorf("message %+v", m)
	}
	if m.Source != row.Source || m.Lane != row.Lane || m.Key == nil || len(m.Key) != 0 {
		t.Errorf("message %+v", m)
	}
	if len(m.Headers) != 3 || m.Headers[0].Key != "k\xff" || string(m.Headers[0].Value) != "\x00" || m.Headers[1].Value != nil || string(m.Headers[2].Value) != "v" {
		t.Errorf("headers %q", m.Headers)
	}
	back := parkedHeaders(m.Headers)
	if len(back) != 3 || back[1].Value != nil || string(back[2].Value) != "v" || parkedHeaders(nil) != nil {
		t.Errorf("headers parked again as %q", back)
	}
}
