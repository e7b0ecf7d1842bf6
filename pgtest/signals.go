package pgtest

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// live holds the servers this process started and has not stopped yet
// (clusters and PgBouncers), so that an interrupt stops them before the
// process ends: a throwaway server must not outlive the program or test
// that started it, even one ended with Ctrl-C.
var live struct {
	mu    sync.Mutex
	stops map[*int]func() error
	once  sync.Once
}

// track registers stop, which stops one server, and returns the function
// that unregisters it once the server was stopped in the ordinary way.
// The first call installs the process's handler of SIGINT and SIGTERM:
// on either, it stops every registered server and then ends the process
// with the status a shell gives a process killed by that signal (130 or
// 143), as the signal itself would have.
func track(stop func() error) (untrack func()) {
	live.once.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		go func() {
			sig := <-ch
			stopAll()
			code := 130
			if sig == syscall.SIGTERM {
				code = 143
			}
			os.Exit(code)
		}()
	})
	key := new(int)
	live.mu.Lock()
	if live.stops == nil {
		live.stops = map[*int]func() error{}
	}
	live.stops[key] = stop
	live.mu.Unlock()
	return func() {
		live.mu.Lock()
		delete(live.stops, key)
		live.mu.Unlock()
	}
}

// stopAll stops every registered server.
func stopAll() {
	live.mu.Lock()
	stops := make([]func() error, 0, len(live.stops))
	for _, s := range live.stops {
		stops = append(stops, s)
	}
	live.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range stops {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s() }()
	}
	wg.Wait()
}
