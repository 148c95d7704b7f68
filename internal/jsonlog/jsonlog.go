// Package jsonlog is the one way str's programs log: JSON lines on
// stderr at a level named by a word (debug, info, warn, error; another
// word means info), the same for `str` and `str-worker`.
package jsonlog

import (
	"log/slog"
	"os"
)

// New is a JSON logger to stderr at level. A time.Duration value is
// written as Go writes it ("1.5s", "250ms"), not as slog's JSON default,
// a count of nanoseconds that reads as a much longer wait
// ("retry_in":500000000).
func New(level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l, ReplaceAttr: durationString}))
}

// durationString is New's ReplaceAttr: durations as their String form.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
