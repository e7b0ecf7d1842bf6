package bloom

import (
	"math"
	"sync"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
)

// sliceFilter holds one slice's filters, one per scope.
//
// A sealed filter was built from the store after every transaction that
// could write to the slice had ended, so a negative from it is proof that
// the slice holds no marker for the key, whichever process wrote the
// marker. A scope without a filter in a sealed slice has no marker there.
//
// An open filter (the current slice, or a slice not yet sealed) only holds
// the keys this process committed or loaded: other consumers write to the
// same slice, so its negative proves nothing. It is a hint that routes
// likely duplicates to the probe.
type sliceFilter struct {
	start   time.Time
	sealed  bool
	keys    int64 // markers loaded from the store
	byScope map[string]*bloom.BloomFilter
}

func (sf *sliceFilter) bytes() int {
	n := 0
	for _, f := range sf.byScope {
		n += int(f.Cap()+7) / 8
	}
	return n
}

// filterSet is every slice's filters, keyed by slice start in Unix seconds.
type filterSet struct {
	mu     sync.RWMutex
	slices map[int64]*sliceFilter
}

// newFilter returns an empty filter sized for n keys at rate p with k hash
// functions. Every filter of a Strategy shares k, so that a key's hash
// locations are computed once and tested against every slice.
func newFilter(n int, p float64, k uint) *bloom.BloomFilter {
	if n < 1 {
		n = 1
	}
	m := uint(math.Ceil(-float64(n) * math.Log(p) / (math.Ln2 * math.Ln2)))
	if m < 64 {
		m = 64
	}
	return bloom.New(m, k)
}

// window returns the filters of the slices from..to (inclusive), one entry
// per slice, nil where there is none. Callers hold mu.
func (fs *filterSet) window(from, to time.Time, slice time.Duration) []*sliceFilter {
	var out []*sliceFilter
	for t := from; !t.After(to); t = t.Add(slice) {
		out = append(out, fs.slices[t.Unix()])
	}
	return out
}

// prune forgets the filters of slices that start before from.
func (fs *filterSet) prune(from time.Time) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := 0
	for k := range fs.slices {
		if k < from.Unix() {
			delete(fs.slices, k)
			n++
		}
	}
	return n
}

// install replaces the filters of sf's slice with sf.
func (fs *filterSet) install(sf *sliceFilter) {
	fs.mu.Lock()
	fs.slices[sf.start.Unix()] = sf
	fs.mu.Unlock()
}

// sealed reports whether the slice starting at t has a sealed filter.
func (fs *filterSet) sealed(t time.Time) bool {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	sf := fs.slices[t.Unix()]
	return sf != nil && sf.sealed
}

// written remembers, for each key a claim made new, the slice (start in
// Unix seconds) its marker went to, until Committed adds the key to that
// slice's filter. Entries of claims that rolled back are replaced when the
// key is claimed again, and forgotten with their slice.
type written struct {
	mu    sync.Mutex
	slice map[scopeID]int64
}

func (w *written) note(keys []scopeID, slice int64) {
	if len(keys) == 0 {
		return
	}
	w.mu.Lock()
	for _, u := range keys {
		w.slice[u] = slice
	}
	w.mu.Unlock()
}

// prune forgets the keys written to slices that start before from.
func (w *written) prune(from time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for u, t := range w.slice {
		if t < from.Unix() {
			delete(w.slice, u)
		}
	}
}
