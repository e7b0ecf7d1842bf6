package highwater

import "sync"

// markCache is a bounded LRU cache of marks, keyed by scope+"\x00"+sender
// (a NUL cannot occur in a valid scope or sender).
//
// It only ever learns from committed outcomes (Strategy.Committed), and marks
// never move backwards, so a cached mark is always at or below the true
// mark: it can prove a duplicate but never a new message.
type markCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]*cacheEntry
	// head is a sentinel of a circular doubly linked list, most recently
	// used first.
	head cacheEntry

	hits, misses, evictions uint64
}

type cacheEntry struct {
	key        string
	mark       int64
	fp         []byte // fingerprint of the message at seq mark, if fpKnown
	fpKnown    bool
	prev, next *cacheEntry
}

// cached is a snapshot of a cache entry.
type cached struct {
	ok      bool
	mark    int64
	fp      []byte
	fpKnown bool
}

func newMarkCache(max int) *markCache {
	c := &markCache{max: max, entries: make(map[string]*cacheEntry, min(max, 1<<16))}
	c.head.prev, c.head.next = &c.head, &c.head
	return c
}

func (c *markCache) unlink(e *cacheEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *markCache) pushFront(e *cacheEntry) {
	e.prev, e.next = &c.head, c.head.next
	c.head.next.prev = e
	c.head.next = e
}

// get returns the cached mark of key, marking it recently used.
func (c *markCache) get(key string) cached {
	if c == nil {
		return cached{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return cached{}
	}
	c.unlink(e)
	c.pushFront(e)
	return cached{ok: true, mark: e.mark, fp: e.fp, fpKnown: e.fpKnown}
}

// count records how many keys the cache answered and how many it could not.
func (c *markCache) count(hits, misses int) {
	if c == nil || hits+misses == 0 {
		return
	}
	c.mu.Lock()
	c.hits += uint64(hits)
	c.misses += uint64(misses)
	c.mu.Unlock()
}

// update is one committed fact about a sender's mark: it is at least seq,
// and if fpKnown, the message at seq had fingerprint fp.
type update struct {
	key     string
	seq     int64
	fp      []byte
	fpKnown bool
}

// raise records committed facts, never lowering a cached mark.
func (c *markCache) raise(ups []update) {
	if c == nil || len(ups) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, u := range ups {
		e, ok := c.entries[u.key]
		if ok {
			c.unlink(e)
			c.pushFront(e)
			switch {
			case u.seq > e.mark:
				e.mark, e.fp, e.fpKnown = u.seq, u.fp, u.fpKnown
			case u.seq == e.mark && !e.fpKnown && u.fpKnown:
				e.fp, e.fpKnown = u.fp, true
			}
			continue
		}
		if len(c.entries) >= c.max {
			old := c.head.prev
			c.unlink(old)
			delete(c.entries, old.key)
			c.evictions++
			// Reuse the evicted entry to spare the allocator.
			*old = cacheEntry{}
			e = old
		} else {
			e = new(cacheEntry)
		}
		e.key, e.mark, e.fp, e.fpKnown = u.key, u.seq, u.fp, u.fpKnown
		c.entries[u.key] = e
		c.pushFront(e)
	}
}

// reset empties the cache.
func (c *markCache) reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
	c.head.prev, c.head.next = &c.head, &c.head
}

func (c *markCache) stats() (hits, misses, evictions uint64, entries int) {
	if c == nil {
		return 0, 0, 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.evictions, len(c.entries)
}
