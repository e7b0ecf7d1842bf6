// Command broker serves a single-broker Kafka cluster (franz-go's kfake,
// with the session expiry of package internal/kafkatest, which reports the
// members it drops on stderr) on a fixed port until it is killed, its
// stdin closes (with -exit-with-stdin) or it gets SIGINT or SIGTERM. Once
// listening it prints "ready <addr>" on stdout.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/effectively-once/effectively/integration/chaos"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 9092, "port to listen on (127.0.0.1)")
	minSession := flag.Duration("min-session-timeout", 6*time.Second, "smallest group session timeout the broker accepts")
	exitWithStdin := flag.Bool("exit-with-stdin", false, "exit when stdin reaches end of file (the parent is gone)")
	flag.Parse()

	c, err := kafkatest.StartFake(
		kfake.Ports(*port),
		kfake.GroupMinSessionTimeout(*minSession),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(1)
	}
	c.LogSessions(os.Stderr)
	w := bufio.NewWriter(os.Stdout)
	for _, a := range c.Brokers() {
		fmt.Fprintln(w, chaos.ReadyLine, a)
	}
	w.Flush()

	done := make(chan struct{})
	if *exitWithStdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			close(done)
		}()
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	select {
	case <-sigs:
	case <-done:
	}
	c.Close()
}
