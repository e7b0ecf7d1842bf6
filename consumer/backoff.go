package consumer

import (
	"math/rand/v2"
	"time"
)

// backoff returns the delay before attempt n+1 after n failures: base
// doubled n-1 times, capped at max, with jitter drawn from the upper half so
// that retries of one failure spread out without ever coming much too early.
func backoff(base, max time.Duration, n int) time.Duration {
	if base <= 0 {
		return 0
	}
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	half := d / 2
	return half + rand.N(half+1)
}
