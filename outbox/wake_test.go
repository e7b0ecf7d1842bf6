package outbox

import (
	"sync"
	"testing"
	"time"
)

// TestNotifyWakes: with polling and lease renewals ten minutes apart, only
// the emitting transaction's NOTIFY can wake the relay.
func TestNotifyWakes(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	listening := make(chan struct{})
	var once sync.Once
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, PollInterval: 10 * time.Minute, LeaseTTL: 30 * time.Minute,
		onListen: func() { once.Do(func() { close(listening) }) }})
	<-listening
	emit(t, db, o, msg("k", "m1"))
	sink.waitFor(t, 2*time.Minute, "m1", hasIDs("m1"))
	emit(t, db, o, msg("k", "m2"))
	sink.waitFor(t, 2*time.Minute, "m2", hasIDs("m2"))
}

// TestPollOnly: without LISTEN (as behind PgBouncer's transaction pooling)
// the relay finds committed rows by polling.
func TestPollOnly(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, PollOnly: true, PollInterval: 50 * time.Millisecond,
		onListen: func() { t.Error("a poll-only relay listened") }})
	emit(t, db, o, msg("k", "m1"))
	sink.waitFor(t, 2*time.Minute, "m1", hasIDs("m1"))
}
