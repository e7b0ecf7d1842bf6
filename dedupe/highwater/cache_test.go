package highwater

import "testing"

// TestMarkCacheLRU: the cache never lowers a mark, keeps the fingerprint of
// the mark's own seq only, and evicts the least recently used sender.
func TestMarkCacheLRU(t *testing.T) {
	c := newMarkCache(2)
	c.raise([]update{{key: "a", seq: 5, fp: []byte("f5"), fpKnown: true}, {key: "b", seq: 1}})
	c.raise([]update{{key: "a", seq: 3, fp: []byte("f3"), fpKnown: true}}) // lower: ignored, but a is now most recent
	if got := c.get("a"); !got.ok || got.mark != 5 || string(got.fp) != "f5" || !got.fpKnown {
		t.Errorf("a = %+v, want mark 5 with fingerprint f5", got)
	}
	c.raise([]update{{key: "b", seq: 1, fp: []byte("g1"), fpKnown: true}}) // learns b's fingerprint
	if got := c.get("b"); got.mark != 1 || string(got.fp) != "g1" {
		t.Errorf("b = %+v", got)
	}
	c.raise([]update{{key: "a", seq: 6}}) // a duplicate proved mark >= 6: fingerprint unknown
	if got := c.get("a"); got.mark != 6 || got.fpKnown {
		t.Errorf("a = %+v, want mark 6 without fingerprint", got)
	}
	// b was used before a: it is evicted by c.
	c.raise([]update{{key: "c", seq: 9}})
	if c.get("b").ok || !c.get("a").ok || !c.get("c").ok {
		t.Error("the least recently used sender was not the one evicted")
	}
	if _, _, ev, n := c.stats(); ev != 1 || n != 2 {
		t.Errorf("evictions %d, entries %d", ev, n)
	}
	c.reset()
	if c.get("a").ok {
		t.Error("reset kept a")
	}
	var off *markCache // CacheSize < 0
	off.raise([]update{{key: "a", seq: 1}})
	if off.get("a").ok {
		t.Error("a disabled cache answered")
	}
}
