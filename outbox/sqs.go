package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/sources/sqs"
)

// Limits SQS puts on what SQSSink sends.
const (
	// SQSMaxSize is the most one message may weigh (body plus attribute
	// names, types and values), and the most one SendMessageBatch may
	// carry in all.
	SQSMaxSize = 256 << 10
	// SQSMaxAttributes is the most message attributes a message may have,
	// the ID attribute included.
	SQSMaxAttributes = 10
	sqsMaxBatch      = 10
	sqsMaxIDLen      = 128 // MessageGroupId, MessageDeduplicationId
	sqsMaxAttrName   = 256
)

// SQSSink publishes to one SQS queue with SendMessageBatch, in groups of at
// most ten messages (and SQSMaxSize bytes).
//
// What a message becomes:
//   - The ID goes in the message attribute sqs.DefaultIDAttribute
//     ("idempotency-key", the same name as IDHeader), which sources/sqs
//     takes as a standard queue's dedupe ID. On a FIFO queue it also goes
//     in MessageDeduplicationId, which sources/sqs takes as a FIFO queue's
//     dedupe ID: the ID itself when it is at most 128 characters of
//     printable ASCII (SQS's alphabet for it), otherwise "sha256-" and the
//     hex SHA-256 of the ID (outbox IDs made by ID and Emit always fit).
//   - On a FIFO queue the key is the MessageGroupId, so one key's messages
//     stay in order: it must be 1 to 128 characters of printable ASCII
//     (sources/sqs gives it back as the message key). On a standard queue
//     the key is not sent: SQS keeps no order there, and has no key.
//   - The value is the body, byte for byte: SQS bodies are text, so the
//     value must be non-empty UTF-8 of the characters SQS allows (tab, LF,
//     CR, U+0020 and above except U+FFFE and U+FFFF). sources/sqs reads
//     the body back as those bytes. A nil or empty value cannot be carried
//     (SQS has no empty body); a value that is not such text could only be
//     carried encoded, which stage B would then see: both are refused.
//   - Each header is a message attribute of its name: a String attribute
//     when its value is text as above, a Binary one otherwise; sources/sqs
//     gives either back as the same bytes. Names must follow SQS's rules
//     (at most 256 of A-Z a-z 0-9 _ - ., no leading, trailing or double
//     period, not starting with "AWS." or "Amazon."), be unique, and there
//     may be at most 9 headers (SQSMaxAttributes with the ID). A nil or
//     empty header value cannot be carried (SQS refuses empty attribute
//     values).
//
// A message that cannot be carried as above, or over SQSMaxSize, is refused
// for good (Permanent) without being sent, and the relay parks it with the
// reason. SQS's per-message refusals of a batch are reported per message:
// for good when SQS says the sender is at fault, for a retry otherwise.
// Once a message of a key fails, the key's later messages of the same
// Publish are not sent (they fail with it), so the key's order holds. SQS
// answers a SendMessageBatch per entry, and may refuse one entry and take
// a later one of the same message group; so on a FIFO queue a batch
// carries at most one message of each group, and a group's next message
// goes in a later batch, sent once SQS has taken the one before. Batches
// are filled from different groups, so this costs requests only when few
// groups have messages waiting (one hot group: one message per request).
//
// A FIFO queue drops a MessageDeduplicationId it has seen in the last five
// minutes, so most of the relay's republishes never reach the next stage;
// those after the window, and all of them on a standard queue, are
// duplicates the next stage drops by its dedupe ID.
type SQSSink struct {
	c    *awssqs.Client
	url  string
	fifo bool
}

var _ Sink = (*SQSSink)(nil)

// NewSQSSink returns a Sink sending to the queue at queueURL with c. A URL
// ending in ".fifo" is a FIFO queue (SQS requires the suffix of FIFO queue
// names).
func NewSQSSink(c *awssqs.Client, queueURL string) (*SQSSink, error) {
	switch {
	case c == nil:
		return nil, errors.New("outbox: NewSQSSink: nil Client")
	case queueURL == "":
		return nil, errors.New("outbox: NewSQSSink: empty queue URL")
	}
	return &SQSSink{c: c, url: queueURL, fifo: strings.HasSuffix(queueURL, ".fifo")}, nil
}

// Publish sends msgs and reports, per message, what failed.
func (s *SQSSink) Publish(ctx context.Context, msgs []Message) error {
	errs := PublishErrors{}
	failedAt := map[string]int{} // per key, the index of its first failed message
	fail := func(i int, err error) {
		errs[i] = err
		if msgs[i].Key != nil {
			if j, ok := failedAt[string(msgs[i].Key)]; !ok || i < j {
				failedAt[string(msgs[i].Key)] = i
			}
		}
	}
	behind := func(i int) bool {
		j, ok := failedAt[string(msgs[i].Key)]
		return msgs[i].Key != nil && ok && i > j
	}
	var pending []sqsPending
	for i := range msgs {
		m := &msgs[i]
		if behind(i) {
			errs[i] = errBehind
			continue
		}
		e, n, err := s.entry(m)
		if err != nil {
			fail(i, Permanent(fmt.Errorf("outbox: SQS cannot carry message %s: %w", m.ID, err)))
			continue
		}
		pending = append(pending, sqsPending{i: i, e: e, size: n})
	}
	for len(pending) > 0 {
		var batch []types.SendMessageBatchRequestEntry
		var idx []int
		var rest []sqsPending
		size := 0
		inBatch := map[string]bool{}  // FIFO groups with an entry in the batch
		deferred := map[string]bool{} // keys with a message left for a later batch
		for _, p := range pending {
			key := msgs[p.i].Key
			k := string(key)
			switch {
			case behind(p.i):
				errs[p.i] = errBehind
				continue
			case len(batch) == sqsMaxBatch || size+p.size > SQSMaxSize,
				key != nil && deferred[k],
				s.fifo && inBatch[k]:
				rest = append(rest, p)
				if key != nil {
					deferred[k] = true
				}
				continue
			}
			p.e.Id = aws.String(strconv.Itoa(len(batch)))
			batch = append(batch, p.e)
			idx = append(idx, p.i)
			size += p.size
			inBatch[k] = true
		}
		pending = rest
		if len(batch) == 0 {
			break
		}
		done, err := s.send(ctx, batch)
		if err != nil {
			for _, i := range idx {
				fail(i, err)
			}
			for _, p := range pending {
				errs[p.i] = err
			}
			return errs
		}
		for n, e := range done {
			if e != nil {
				fail(idx[n], e)
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// sqsPending is a message's entry waiting for a batch.
type sqsPending struct {
	i    int
	e    types.SendMessageBatchRequestEntry
	size int
}

// send sends one SendMessageBatch and returns, per entry, nil when SQS
// listed it as successful and the error otherwise; or an error for the
// whole request.
func (s *SQSSink) send(ctx context.Context, batch []types.SendMessageBatchRequestEntry) ([]error, error) {
	out, err := s.c.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(s.url), Entries: batch})
	if err != nil {
		return nil, classifySQS(err)
	}
	// Only what SQS lists as successful counts as sent.
	done := make([]error, len(batch))
	for n := range done {
		done[n] = errors.New("outbox: SQS said nothing of the message")
	}
	for _, ok := range out.Successful {
		if n, perr := strconv.Atoi(aws.ToString(ok.Id)); perr == nil && n >= 0 && n < len(done) {
			done[n] = nil
		}
	}
	for _, f := range out.Failed {
		n, perr := strconv.Atoi(aws.ToString(f.Id))
		if perr != nil || n < 0 || n >= len(done) {
			continue
		}
		e := fmt.Errorf("outbox: SQS refused the message: %s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
		if f.SenderFault && !transientSQSCode(aws.ToString(f.Code)) {
			e = Permanent(e)
		}
		done[n] = e
	}
	return done, nil
}

// entry builds m's batch entry and returns its size as SQS counts it.
func (s *SQSSink) entry(m *Message) (types.SendMessageBatchRequestEntry, int, error) {
	var e types.SendMessageBatchRequestEntry
	if len(m.Value) == 0 {
		return e, 0, errors.New("a nil or empty value (SQS has no empty body)")
	}
	if r := sqsText(m.Value); r != "" {
		return e, 0, fmt.Errorf("the value %s (SQS bodies are text)", r)
	}
	if len(m.Headers)+1 > SQSMaxAttributes {
		return e, 0, fmt.Errorf("%d headers (SQS takes %d message attributes, one of them the ID)", len(m.Headers), SQSMaxAttributes-1)
	}
	if r := sqsText([]byte(m.ID)); m.ID == "" || r != "" {
		return e, 0, fmt.Errorf("an ID that is not SQS text")
	}
	size := len(m.Value)
	attrs := make(map[string]types.MessageAttributeValue, len(m.Headers)+1)
	for _, h := range m.Headers {
		if r := sqsAttrName(h.Key); r != "" {
			return e, 0, fmt.Errorf("header %q: %s", h.Key, r)
		}
		if _, dup := attrs[h.Key]; dup || h.Key == sqs.DefaultIDAttribute {
			return e, 0, fmt.Errorf("header %q twice (message attributes are unique by name)", h.Key)
		}
		if len(h.Value) == 0 {
			return e, 0, fmt.Errorf("header %q has a nil or empty value (SQS refuses empty attribute values)", h.Key)
		}
		v := types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(string(h.Value))}
		if sqsText(h.Value) != "" {
			v = types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: h.Value}
		}
		attrs[h.Key] = v
		size += len(h.Key) + len(*v.DataType) + len(h.Value)
	}
	attrs[sqs.DefaultIDAttribute] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(m.ID)}
	size += len(sqs.DefaultIDAttribute) + len("String") + len(m.ID)
	if size > SQSMaxSize {
		return e, 0, fmt.Errorf("%d bytes, over SQS's %d", size, SQSMaxSize)
	}
	e.MessageBody = aws.String(string(m.Value))
	e.MessageAttributes = attrs
	if s.fifo {
		if m.Key == nil {
			return e, 0, errors.New("a nil key on a FIFO queue (the key is the MessageGroupId)")
		}
		if !sqsIDText(string(m.Key)) {
			return e, 0, errors.New("a key that is not a MessageGroupId (1 to 128 characters of printable ASCII)")
		}
		e.MessageGroupId = aws.String(string(m.Key))
		e.MessageDeduplicationId = aws.String(SQSDeduplicationID(m.ID))
	}
	return e, size, nil
}

// SQSDeduplicationID is the MessageDeduplicationId SQSSink sends for a
// message of ID id on a FIFO queue, and so the dedupe ID sources/sqs gives
// it: id itself when it fits SQS's rules (1 to 128 characters of printable
// ASCII), otherwise "sha256-" and the hex SHA-256 of id.
func SQSDeduplicationID(id string) string {
	if sqsIDText(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256-" + hex.EncodeToString(sum[:])
}

// sqsIDText reports whether s is 1 to 128 characters of alphanumerics and
// punctuation, what SQS takes as a group or deduplication ID.
func sqsIDText(s string) bool {
	if len(s) == 0 || len(s) > sqsMaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return false
		}
	}
	return true
}

// sqsText says why b is not text SQS carries in a body or String
// attribute, or "" when it is.
func sqsText(b []byte) string {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			return "is not valid UTF-8"
		}
		if !(r == '\t' || r == '\n' || r == '\r' || (r >= 0x20 && r != 0xFFFE && r != 0xFFFF)) {
			return fmt.Sprintf("has the character %U, which SQS does not allow", r)
		}
		b = b[n:]
	}
	return ""
}

// sqsAttrName says why name is not a message attribute name, or "".
func sqsAttrName(name string) string {
	lower := strings.ToLower(name)
	switch {
	case name == "" || len(name) > sqsMaxAttrName:
		return "an SQS attribute name has 1 to 256 characters"
	case strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, ".."):
		return "an SQS attribute name has no leading, trailing or double period"
	case strings.HasPrefix(lower, "aws.") || strings.HasPrefix(lower, "amazon."):
		return "names starting with AWS. or Amazon. are reserved by SQS"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return "an SQS attribute name is made of A-Z a-z 0-9 _ - ."
		}
	}
	return ""
}

// classifySQS marks the refusals of a whole request that a retry cannot
// change. The relay then sends the messages one by one, so that only the
// one at fault is parked.
func classifySQS(err error) error {
	var (
		noQueue  *types.QueueDoesNotExist
		contents *types.InvalidMessageContents
		tooLong  *types.BatchRequestTooLong
		unsup    *types.UnsupportedOperation
		addr     *types.InvalidAddress
	)
	if errors.As(err, &noQueue) || errors.As(err, &contents) || errors.As(err, &tooLong) ||
		errors.As(err, &unsup) || errors.As(err, &addr) {
		return Permanent(err)
	}
	var ae interface{ ErrorCode() string } // smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "InvalidParameterValue",
			"InvalidMessageContents", "AWS.SimpleQueueService.BatchRequestTooLong", "MessageTooLong":
			return Permanent(err)
		}
	}
	return err
}

// transientSQSCode reports codes SQS may put on a sender's entry that a
// retry can still cure.
func transientSQSCode(code string) bool {
	switch code {
	case "RequestThrottled", "ThrottlingException", "AWS.SimpleQueueService.RequestThrottled",
		"KmsThrottled", "KMS.ThrottlingException", "ServiceUnavailable", "InternalError":
		return true
	}
	return false
}
