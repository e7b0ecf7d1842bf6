// Package logx holds the library's default loggers.
package logx

import (
	"log/slog"
	"os"
)

// Default is the logger of a component whose Config gives none: warnings
// and errors as text on stderr, so that a failure (a wrong broker address,
// a missing queue, a batch that keeps rolling back) is seen without any
// set-up. Pass a logger to change that, or slog.New(slog.DiscardHandler)
// to silence it.
func Default() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// Discard is a logger that drops everything, for components that are quiet
// unless given a logger.
func Discard() *slog.Logger {
	return slog.New(slog.DiscardHandler)
}
