package consumer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
)

// TestFingerprintJSON: with FingerprintJSON, a producer's resend of an
// event re-serialized with its members in another order and other
// whitespace is a duplicate, a changed value is still a mismatch, and a
// payload that is not JSON is parked with the reason; with the default,
// the reordered resend is a mismatch.
func TestFingerprintJSON(t *testing.T) {
	t.Parallel()
	for _, mode := range []consumer.FingerprintMode{consumer.FingerprintBytes, consumer.FingerprintJSON} {
		t.Run(map[consumer.FingerprintMode]string{consumer.FingerprintBytes: "bytes", consumer.FingerprintJSON: "json"}[mode], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 1})
			e.broker.Publish(0, msg("pay-1", `{"amount":500,"to":"acct_9"}`))
			e.broker.Publish(0, msg("pay-1", `{ "to": "acct_9", "amount": 500 }`)) // re-serialized resend
			e.broker.Publish(0, msg("pay-1", `{"amount":501,"to":"acct_9"}`))      // a changed amount
			e.broker.Publish(0, msg("raw-1", `not json`))
			e.runUntilIdle(e.consumer(consumer.Config{Fingerprint: mode, BatchSize: 1}), 30*time.Second)
			st := e.hooks.Total()
			rows := e.parked()
			switch mode {
			case consumer.FingerprintBytes:
				if got := e.effectCounts(); got["pay-1"] != 1 || got["raw-1"] != 1 {
					t.Fatalf("effects %v", got)
				}
				if st.Mismatch != 2 || st.Duplicate != 0 || len(rows) != 0 {
					t.Fatalf("mismatch %d duplicate %d parked %d, want 2 0 0", st.Mismatch, st.Duplicate, len(rows))
				}
			case consumer.FingerprintJSON:
				if got := e.effectCounts(); got["pay-1"] != 1 || got["raw-1"] != 0 {
					t.Fatalf("effects %v", got)
				}
				if st.Mismatch != 1 || st.Duplicate != 1 {
					t.Fatalf("mismatch %d duplicate %d, want 1 1", st.Mismatch, st.Duplicate)
				}
				if len(rows) != 1 || rows[0].Reason != parked.ReasonInvalidKey || string(rows[0].Payload) != "not json" ||
					!strings.Contains(rows[0].LastError, "not JSON") {
					t.Fatalf("parked %+v, want raw-1 with reason invalid_key", rows)
				}
			}
		})
	}
}

func TestFingerprintModeIsChecked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	_, err := consumer.New(e.pool, e.broker, e.config(consumer.Config{Fingerprint: 7}))
	if err == nil || !strings.Contains(err.Error(), "Fingerprint") {
		t.Fatalf("New with an unknown Fingerprint mode: %v", err)
	}
}
