package fauxqs_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/effectively-once/effectively/internal/fauxqs"
)

func TestMain(m *testing.M) { fauxqs.Main(m) }

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	c := fauxqs.Client(t)
	q := fauxqs.NewQueue(t, c, "roundtrip", nil)
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(q), MessageBody: aws.String("hello")}); err != nil {
		t.Fatalf("send: %v", err)
	}
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), WaitTimeSeconds: 1})
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	if len(out.Messages) != 1 || aws.ToString(out.Messages[0].Body) != "hello" {
		t.Fatalf("received %+v, want one message \"hello\"", out.Messages)
	}
}
