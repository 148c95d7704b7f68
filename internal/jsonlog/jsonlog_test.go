package jsonlog

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"
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

// A duration is logged as Go writes it ("500ms"), not as nanoseconds
// (the worker's "retry_in":500000000).
func TestDurationsReadable(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w // New writes to the os.Stderr of its call
	l := New("info")
	os.Stderr = stderr
	l.Info("connect failed, retrying", "retry_in", 500*time.Millisecond, slog.Group("g", "d", 90*time.Second), "n", 3)
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	var line struct {
		RetryIn string `json:"retry_in"`
		G       struct {
			D string `json:"d"`
		} `json:"g"`
		N int `json:"n"`
	}
	if err := json.Unmarshal(out, &line); err != nil || line.RetryIn != "500ms" || line.G.D != "1m30s" || line.N != 3 {
		t.Errorf("log line %s (%v): want retry_in \"500ms\", g.d \"1m30s\", n 3", out, err)
	}
}
