// Package syncbuf is a bytes.Buffer that several goroutines or commands
// may write at once: the log and stderr sinks of the tests and of
// str-bench, which read it back while the writers still run.
//
// It protects against nothing; it is support code.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a concurrency-safe bytes.Buffer (the zero value is empty and
// ready to use).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Len is how many bytes were written so far.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Len()
}
