package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress draws a progress bar with the rate on w, redrawn in place every
// 200ms, and a final line when it stops.
type progress struct {
	w       io.Writer
	label   string
	total   int64
	start   time.Time
	enabled bool

	mu      sync.Mutex
	done    int64
	stopped bool
	quit    chan struct{}
	wg      sync.WaitGroup
}

// newProgress starts a progress bar; mode is "auto" (only when w is a
// terminal), "always" or "never".
func newProgress(w io.Writer, label string, total int64, mode string) *progress {
	p := &progress{w: w, label: label, total: total, start: time.Now(), quit: make(chan struct{})}
	p.enabled = mode == "always" || (mode == "auto" && isTerminal(w))
	if p.enabled {
		p.wg.Add(1)
		go p.loop()
	}
	return p
}

func (p *progress) add(n int64) {
	p.mu.Lock()
	p.done += n
	p.mu.Unlock()
}

func (p *progress) loop() {
	defer p.wg.Done()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
			p.draw(false)
		}
	}
}

func (p *progress) draw(final bool) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	elapsed := time.Since(p.start).Seconds()
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed
	}
	frac := 1.0
	if p.total > 0 {
		frac = min(float64(done)/float64(p.total), 1)
	}
	const width = 30
	fill := int(frac * width)
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r%s [%s] %d/%d %3.0f%% %.0f msg/s%s", p.label, bar, done, p.total, frac*100, rate, end)
}

// stop ends the bar; it may be called more than once.
func (p *progress) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	p.mu.Unlock()
	if p.enabled {
		close(p.quit)
		p.wg.Wait()
		p.draw(true)
	}
}
