package sqs_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

// receiveAll fetches and acknowledges n messages, returned by body.
func receiveAll(t *testing.T, src *sqs.Source, n int) map[string]*consumer.Message {
	t.Helper()
	got := map[string]*consumer.Message{}
	for len(got) < n {
		b := fetch(t, src, 10)
		for _, m := range b.Messages {
			got[string(m.Value)] = m
		}
		settle(t, src, b, b.Messages, nil)
	}
	return got
}

// TestStandardIDs: the idempotency-key attribute is the default ID, else the
// MessageId; attributes become headers.
func TestStandardIDs(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "ids", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 1}))
	send(t, c, queue, []outgoing{
		{Body: "keyed", Attrs: map[string]string{"idempotency-key": "order-42", "tenant": "acme"}},
		{Body: "unkeyed"},
		{Body: "empty-key", Attrs: map[string]string{"idempotency-key": " "}},
	})
	got := receiveAll(t, src, 3)
	if m := got["keyed"]; m.ID != "order-42" || m.Ref == "order-42" {
		t.Fatalf("keyed: ID %q Ref %q, want ID order-42 and Ref the MessageId", m.ID, m.Ref)
	}
	if v, ok := got["keyed"].Header("tenant"); !ok || string(v) != "acme" {
		t.Fatalf("keyed: header tenant = %q, %v", v, ok)
	}
	if m := got["unkeyed"]; m.ID != m.Ref || m.ID == "" {
		t.Fatalf("unkeyed: ID %q Ref %q, want the MessageId for both", m.ID, m.Ref)
	}
	if m := got["empty-key"]; m.ID != " " {
		t.Fatalf("empty-key: ID %q, want the attribute as sent", m.ID)
	}
	for _, m := range got {
		if sqs.Unreadable(m) != nil {
			t.Fatalf("%s: unexpectedly unreadable: %v", m.Value, sqs.Unreadable(m))
		}
	}
}

// TestRequiredIDAttribute: with RequireIDAttribute a message without the
// attribute has no ID and ParkUnreadable reports why.
func TestRequiredIDAttribute(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "required", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 1, IDAttribute: "event-id", RequireIDAttribute: true}))
	send(t, c, queue, []outgoing{
		{Body: "with", Attrs: map[string]string{"event-id": "e1"}},
		{Body: "without", Attrs: map[string]string{"idempotency-key": "k"}},
	})
	got := receiveAll(t, src, 2)
	keyFunc := sqs.ParkUnreadable(nil)
	if k, err := keyFunc(got["with"]); err != nil || k.ID != "e1" {
		t.Fatalf("with: key %v, %v; want e1", k, err)
	}
	m := got["without"]
	if m.ID != "" {
		t.Fatalf("without: ID %q, want none", m.ID)
	}
	_, err := keyFunc(m)
	var ue *sqs.UnreadableError
	if !errors.Is(err, sqs.ErrUnreadable) || !errors.As(err, &ue) || ue.MessageID != m.Ref {
		t.Fatalf("without: ParkUnreadable error %v, want an UnreadableError naming %s", err, m.Ref)
	}
}

func envelope(t *testing.T, id, message string, attrs map[string]string) string {
	t.Helper()
	type attr struct{ Type, Value string }
	a := map[string]attr{}
	for k, v := range attrs {
		a[k] = attr{"String", v}
	}
	b, err := json.Marshal(map[string]any{
		"Type": "Notification", "MessageId": id, "TopicArn": "arn:aws:sns:us-east-1:000000000000:hooks",
		"Message": message, "Timestamp": "2026-11-29T09:00:00.000Z", "MessageAttributes": a,
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSNSEnvelope unwraps SNS notifications: the inner message is the value,
// the SNS MessageId the default ID unless an idempotency-key attribute says
// otherwise, and a body that is not an envelope is unreadable.
func TestSNSEnvelope(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "sns", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 1, SNSEnvelope: true}))
	send(t, c, queue, []outgoing{
		{Body: envelope(t, "sns-1", `{"n":1}`, map[string]string{"kind": "created"})},
		{Body: envelope(t, "sns-2", `{"n":2}`, map[string]string{"idempotency-key": "hook-2"})},
		{Body: "not json at all"},
		{Body: `{"hello":"world"}`},
	})
	got := map[string]*consumer.Message{}
	for len(got) < 4 {
		b := fetch(t, src, 10)
		for _, m := range b.Messages {
			key := string(m.Value)
			if sqs.Unreadable(m) != nil {
				key = m.Ref
			}
			got[key] = m
		}
		settle(t, src, b, b.Messages, nil)
	}
	m1 := got[`{"n":1}`]
	if m1 == nil || m1.ID != "sns-1" || m1.Time.IsZero() {
		t.Fatalf("first notification: %+v, want ID sns-1", m1)
	}
	if v, _ := m1.Header("kind"); string(v) != "created" {
		t.Fatalf("first notification: header kind = %q", v)
	}
	if info, _ := sqs.MessageInfo(m1); info.SNSMessageID != "sns-1" || info.TopicARN == "" {
		t.Fatalf("MessageInfo %+v", info)
	}
	if m2 := got[`{"n":2}`]; m2 == nil || m2.ID != "hook-2" {
		t.Fatalf("second notification: %+v, want ID hook-2", m2)
	}
	unreadable := 0
	for _, m := range got {
		if err := sqs.Unreadable(m); err != nil {
			unreadable++
			if m.ID != "" {
				t.Fatalf("unreadable message has ID %q", m.ID)
			}
			if _, kerr := sqs.ParkUnreadable(nil)(m); !errors.Is(kerr, sqs.ErrUnreadable) {
				t.Fatalf("ParkUnreadable on an unreadable message: %v", kerr)
			}
		}
	}
	if unreadable != 2 {
		t.Fatalf("%d unreadable messages, want 2 (not JSON, JSON without an envelope)", unreadable)
	}
}

// TestParkUnreadableDelegates: ParkUnreadable passes readable messages to next.
func TestParkUnreadableDelegates(t *testing.T) {
	t.Parallel()
	m := &consumer.Message{ID: "x", Value: []byte(`{"event_id":"e9"}`)}
	k, err := sqs.ParkUnreadable(consumer.JSONField("event_id"))(m)
	if err != nil || k.ID != "e9" {
		t.Fatalf("key %v, %v; want e9", k, err)
	}
	if k, err := sqs.ParkUnreadable(nil)(m); err != nil || k.ID != "x" {
		t.Fatalf("key %v, %v; want x", k, err)
	}
}
