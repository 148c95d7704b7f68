// Package jsonlog is the one way str's programs log: JSON lines on
// stderr at a level named by a word (debug, info, warn, error; another
// word means info), the same for `str` and `str-worker`.
package jsonlog

import (
	"log/slog"
	"os"
)

// New is a JSON logger to stderr at level.
func New(level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}
