package jsonlog

import (
	"context"
	"log/slog"
	"testing"
)

// A level word sets the level; an unknown word means info.
func TestNewLevels(t *testing.T) {
	for word, want := range map[string]slog.Level{"debug": slog.LevelDebug, "warn": slog.LevelWarn, "error": slog.LevelError, "info": slog.LevelInfo, "loud": slog.LevelInfo} {
		l := New(word)
		if !l.Enabled(context.Background(), want) || (want > slog.LevelDebug && l.Enabled(context.Background(), want-1)) {
			t.Errorf("%q: not exactly level %v", word, want)
		}
	}
}
