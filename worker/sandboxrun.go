package worker

// A started sandbox as the worker watches it: its end, the runner's
// signals on the done pipe, the tail of its stderr.

import (
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// tailBuffer is an io.Writer that keeps the last max bytes written to it
// (a sandbox's stderr: the end of a traceback is what explains a crash).
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	total int64
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	if len(p) >= b.max {
		b.buf = append(b.buf[:0], p[len(p)-b.max:]...)
		return len(p), nil
	}
	if over := len(b.buf) + len(p) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// String is the kept tail, trimmed, as valid UTF-8; when earlier output
// was dropped it starts with "…" (and never inside a UTF-8 sequence).
func (b *tailBuffer) String() string {
	s, _ := b.tail(b.max)
	return s
}

// tail is String for the last n bytes kept (n <= max), and whether
// earlier output was dropped.
func (b *tailBuffer) tail(n int) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	tail := b.buf
	if len(tail) > n {
		tail = tail[len(tail)-n:]
	}
	prefix := ""
	cut := b.total > int64(len(tail))
	if cut {
		prefix = "…"
		for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
			tail = tail[1:]
		}
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(tail), "\uFFFD"))
	if s == "" {
		return "", cut
	}
	return prefix + s, cut
}

// The runner's signals on its done pipe (runner.py --done-fd).
const (
	signalReady = 'r' // warm runner: imports done, waiting for its arguments
	signalDone  = 'd' // result.json is complete (written and renamed)
)

// sandboxRun is a started sandbox as the worker watches it: its end
// (Wait, in a goroutine) and the runner's signals on the done pipe.
type sandboxRun struct {
	sb      Sandbox
	exited  chan struct{} // closed when Wait has returned; exit and waitErr are set then
	exit    *SandboxExit
	waitErr error
	ready   chan struct{} // closed on signalReady; readyAt is set before
	readyAt time.Time
	done    chan struct{} // closed on signalDone; doneAt is set before
	doneAt  time.Time
	// signalsRead is closed once the done pipe has been read to its
	// signalDone or its end (at once without a done pipe).
	signalsRead chan struct{}
}

// watchSandbox starts watching sb; doneR (nil = no done pipe) is the
// worker's read end of the runner's done pipe, closed by the watcher.
func watchSandbox(sb Sandbox, doneR *os.File) *sandboxRun {
	run := &sandboxRun{sb: sb, exited: make(chan struct{}), ready: make(chan struct{}), done: make(chan struct{}), signalsRead: make(chan struct{})}
	go func() {
		run.exit, run.waitErr = sb.Wait()
		close(run.exited)
	}()
	if doneR != nil {
		go run.readSignals(doneR)
	} else {
		close(run.signalsRead)
	}
	return run
}

// signalsReadBound bounds how long a sandbox's end waits for its done
// pipe to be read to the end (every write end closes with the sandbox,
// so the reader returns at once; the bound only keeps a stray write end
// from holding a reply).
const signalsReadBound = 5 * time.Second

// doneBeforeEnd reports, once the sandbox has ended, whether its runner
// said its result was complete: the done pipe is read to its end first,
// so the answer does not depend on which of the two watching goroutines
// ran first (a machine under load ran the exit's first, and a cancel
// that came after a complete result turned it into CANCELLED).
func (run *sandboxRun) doneBeforeEnd() bool {
	select {
	case <-run.done:
		return true
	case <-run.signalsRead:
	case <-time.After(signalsReadBound):
	}
	select {
	case <-run.done:
		return true
	default:
		return false
	}
}

// readSignals reads the done pipe until signalDone or EOF (every write
// end is closed once the sandbox is gone). The bytes are hints only: a
// tool can write on the descriptor too, so nothing but timing depends on
// them (awaitResult reads result.json itself).
func (run *sandboxRun) readSignals(doneR *os.File) {
	defer close(run.signalsRead)
	defer doneR.Close()
	var b [1]byte
	for {
		n, err := doneR.Read(b[:])
		if n == 1 {
			switch b[0] {
			case signalReady:
				if run.readyAt.IsZero() {
					run.readyAt = time.Now()
					close(run.ready)
				}
			case signalDone:
				run.doneAt = time.Now()
				close(run.done)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// teardown kills what is left of the sandbox (its result is taken, or it
// is not wanted) and returns once the whole sandbox is gone.
func (run *sandboxRun) teardown() {
	select {
	case <-run.exited:
		return
	default:
	}
	run.sb.Kill()
	<-run.exited
}
