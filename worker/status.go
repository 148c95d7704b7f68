package worker

// The status relay: the tool's status lines, read from its FIFO and
// published in order, with back-pressure and bounds.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// statusRelay reads the status FIFO and publishes each line, in order.
// Reading and publishing are two goroutines joined by a queue bounded in
// bytes (statusQueue). While the queue is full the reader waits, so the
// FIFO fills and the tool's next status write blocks: a broker slower
// than the tool slows the tool down, no line within the caps is lost, and
// a slow subscriber costs at most statusQueueBytes of the worker's memory
// per task (plus the FIFO's own buffer in the kernel). Only lines beyond
// the caps (maxStatusLines, statusTaskBytes) are dropped and counted. A
// tool blocked writing status is still ended by its timeout or a cancel:
// the sandbox is killed, the relay reads what is left.
type statusRelay struct {
	r, w   *os.File
	reader *fifoReader
	done   chan struct{} // closed once every queued line is published
	once   sync.Once
}

func (s *Server) startStatusRelay(t *task, path string) (*statusRelay, error) {
	// 1. read end, non-blocking so the open does not wait for a writer;
	// the fd stays non-blocking and is read through Go's poller.
	rfd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(rfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		unix.Close(rfd)
		return nil, fmt.Errorf("%s is not a FIFO", path)
	}
	r := os.NewFile(uintptr(rfd), path)
	// 2. the worker's own write end (succeeds at once: a reader exists).
	w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("open %s for writing: %w", path, err)
	}
	rel := &statusRelay{r: r, w: w, reader: &fifoReader{f: r}, done: make(chan struct{})}
	q := newStatusQueue(statusQueueBytes, statusTaskBytes, maxStatusLines)
	// 3. the publisher: in order, until the reader has closed the queue
	// and it is empty; then the drop notice, if any. The first publish
	// that fails (the broker unreachable for the publish's whole wait)
	// ends the task's status publishing: the later lines are read and
	// counted lost without waiting for the broker each (a tool writing
	// 100 lines during an outage would otherwise hold its reply for 100
	// waits); logged once, counted in str_worker_status_lines_lost_total.
	go func() {
		defer close(rel.done)
		failed := false
		for {
			line, ok := q.pop()
			if !ok {
				break
			}
			if !failed {
				err := s.relayStatus(t, line)
				if err == nil {
					continue
				}
				failed = true
				t.log.Warn("publishing a status line failed: this and the task's later status lines are lost",
					"status_to", t.statusTo, "error", err)
			}
			s.metrics.StatusLost.Inc()
		}
		if !failed {
			s.finishStatus(t, q)
		}
	}()
	// 4. the reader.
	go func() {
		defer q.close()
		s.relayLines(t, rel.reader, q)
	}()
	return rel, nil
}

// drain relays what the FIFO holds now and stops, without waiting for
// EOF (a process of the tool may still hold a write end): used when the
// runner has signalled its result, after which every line it wrote is in
// the FIFO or relayed already (its writes are blocking and complete).
// It returns once every line read is published (or dropped).
func (r *statusRelay) drain() {
	r.reader.draining.Store(true)
	r.r.SetReadDeadline(time.Unix(1, 0)) // wakes a blocked read
	<-r.done
}

// finish closes the worker's write end and relays what the FIFO holds,
// as drain does: the sandbox is gone, and with it (its pid namespace)
// every process that could write, so what they wrote is in the FIFO. No
// clock bounds it: the reader may wait for a slow broker (back-pressure)
// without losing those lines, and drainLimit bounds the reading.
// (SANDBOX_MODE=none has no pid namespace: what a process the tool left
// running writes after the tool's end is not relayed.) After drain it
// only closes. Safe to call more than once.
func (r *statusRelay) finish() {
	r.once.Do(func() {
		r.w.Close()
		r.reader.draining.Store(true)
		r.r.SetReadDeadline(time.Unix(1, 0)) // wakes a blocked read
		<-r.done
		r.r.Close()
	})
}

// fifoReader reads the status FIFO through Go's poller until draining is
// set; from then on each read takes only what is there (non-blocking) and
// reports EOF when nothing is, after at most drainLimit bytes (a tool
// that keeps writing cannot hold the reply).
type fifoReader struct {
	f        *os.File
	draining atomic.Bool
	drained  int
}

const drainLimit = 4 << 20

func (r *fifoReader) Read(p []byte) (int, error) {
	if !r.draining.Load() {
		n, err := r.f.Read(p)
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !r.draining.Load() {
			return n, err
		}
	}
	if r.drained >= drainLimit {
		return 0, io.EOF
	}
	rc, err := r.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	for attempt := 0; ; attempt++ {
		// drain's deadline is in the past: clear it, so the raw read below
		// is not refused (it never waits: the function returns true).
		r.f.SetReadDeadline(time.Time{})
		var n int
		var rerr error
		err = rc.Read(func(fd uintptr) bool {
			for {
				n, rerr = unix.Read(int(fd), p)
				if rerr != unix.EINTR {
					return true
				}
			}
		})
		if errors.Is(err, os.ErrDeadlineExceeded) && attempt == 0 {
			continue // drain set its deadline after ours was cleared
		}
		switch {
		case err != nil:
			return 0, err
		case rerr == unix.EAGAIN || n == 0:
			return 0, io.EOF
		case rerr != nil:
			return 0, rerr
		}
		r.drained += n
		return n, nil
	}
}

// statusQueue holds the status lines read and not yet published: FIFO
// order, bounded in queued bytes (maxQueued: push waits for room), in
// bytes accepted over the task's life (maxTotal) and in lines accepted
// (maxLines): a line beyond either cap is dropped and counted, at once.
type statusQueue struct {
	mu                  sync.Mutex
	cond                *sync.Cond // signals a push, a pop and close
	lines               [][]byte
	queued, peak        int    // bytes in lines now; the most ever
	total, accepted     int    // bytes and lines accepted so far
	dropped, droppedB   int    // lines and bytes dropped
	waits               int    // pushes that waited for room
	onFirstWait         func() // called (under mu) as the first wait begins
	maxQueued, maxTotal int
	maxLines            int
	closed              bool
	firstDropReason     string
}

func newStatusQueue(maxQueued, maxTotal, maxLines int) *statusQueue {
	q := &statusQueue{maxQueued: maxQueued, maxTotal: maxTotal, maxLines: maxLines}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push queues line, waiting while the queue holds maxQueued bytes (an
// empty queue takes any line), or drops it when it is beyond the task's
// caps. It returns why it was dropped ("" when queued), whether it was
// the task's first drop, and whether it had to wait.
func (q *statusQueue) push(line []byte) (reason string, first, waited bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	// 1. the caps: a line beyond them is dropped without waiting.
	switch {
	case q.accepted >= q.maxLines:
		reason = fmt.Sprintf("more than %d status lines", q.maxLines)
	case q.total+len(line) > q.maxTotal:
		reason = fmt.Sprintf("more than %d bytes of status text", q.maxTotal)
	}
	if reason != "" {
		q.dropped++
		q.droppedB += len(line)
		if q.dropped == 1 {
			q.firstDropReason = reason
		}
		return reason, q.dropped == 1, false
	}
	// 2. back-pressure: wait for the publisher to make room. The reader
	// is the only pusher, so nothing else can take the room meanwhile.
	for q.queued > 0 && q.queued+len(line) > q.maxQueued && !q.closed {
		if !waited {
			waited = true
			q.waits++
			if q.waits == 1 && q.onFirstWait != nil {
				q.onFirstWait()
			}
		}
		q.cond.Wait()
	}
	// 3. queue it.
	q.lines = append(q.lines, line)
	q.queued += len(line)
	q.peak = max(q.peak, q.queued)
	q.total += len(line)
	q.accepted++
	q.cond.Broadcast()
	return "", false, waited
}

// pop returns the oldest line, waiting for one; ok is false once the
// queue is closed and empty.
func (q *statusQueue) pop() ([]byte, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.lines) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.lines) == 0 {
		return nil, false
	}
	line := q.lines[0]
	q.lines[0] = nil
	q.lines = q.lines[1:]
	q.queued -= len(line)
	q.cond.Broadcast() // room for a waiting push
	return line, true
}

func (q *statusQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// relayLines reads the FIFO line by line (each cut to maxStatusLine) into
// q until EOF or a read error.
func (s *Server) relayLines(t *task, r io.Reader, q *statusQueue) {
	br := bufio.NewReaderSize(r, maxStatusLine)
	q.mu.Lock()
	q.onFirstWait = func() {
		t.log.Debug("status queue full: the status pipe is read at the broker's pace (the tool's status writes wait)",
			"queue_limit_bytes", statusQueueBytes)
	}
	q.mu.Unlock()
	for {
		line, err := readLine(br)
		if len(line) > 0 {
			if reason, first, _ := q.push(line); first {
				t.log.Warn("status lines dropped; the rest of the task's drops are counted and reported at its end", "reason", reason,
					"task_limit_bytes", statusTaskBytes, "line_limit", maxStatusLines)
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.log.Warn("reading the status pipe stopped", "error", err)
			}
			return
		}
	}
}

// finishStatus runs once every queued line is published: dropped lines
// are logged with their count (there is no metric for them yet: the log
// line is the count) and announced to the agent by one last status line.
func (s *Server) finishStatus(t *task, q *statusQueue) {
	q.mu.Lock()
	dropped, droppedB, accepted, peak, waits, why := q.dropped, q.droppedB, q.accepted, q.peak, q.waits, q.firstDropReason
	q.mu.Unlock()
	if dropped == 0 {
		if waits > 0 {
			t.log.Debug("status lines relayed at the broker's pace", "status_lines_relayed", accepted,
				"status_queue_peak_bytes", peak, "status_queue_waits", waits)
		}
		return
	}
	t.log.Warn("status lines dropped", "status_lines_dropped", dropped, "status_bytes_dropped", droppedB,
		"status_lines_relayed", accepted, "status_queue_peak_bytes", peak, "status_queue_waits", waits, "first_reason", why)
	if err := s.publishStatusText(t, fmt.Sprintf("[str] %d status lines (%d bytes) were dropped: %s", dropped, droppedB, why)); err != nil {
		s.metrics.StatusLost.Inc()
		t.log.Warn("publishing the status drop notice failed", "status_to", t.statusTo, "error", err)
	}
}

// readLine returns one line without its newline, truncated to
// maxStatusLine bytes (the rest of an overlong line is discarded).
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line) < maxStatusLine {
			room := maxStatusLine - len(line)
			if len(chunk) < room {
				room = len(chunk)
			}
			line = append(line, chunk[:room]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), err
	}
}

// relayStatus publishes one status line ({"status": "..."} as the runner
// writes it; any other line is relayed as its text).
func (s *Server) relayStatus(t *task, line []byte) error {
	text := string(line)
	var doc struct {
		Status *string `json:"status"`
	}
	if json.Unmarshal(line, &doc) == nil && doc.Status != nil {
		text = *doc.Status
	}
	return s.publishStatusText(t, strings.ToValidUTF8(text, "\uFFFD"))
}

// publishStatusText publishes one status notification of t; a request
// without statusTo has nowhere to send it (nil).
func (s *Server) publishStatusText(t *task, text string) error {
	if t.statusTo == "" {
		s.metrics.StatusLines.Inc()
		return nil
	}
	if err := s.publish(t.statusTo, EncodeStatus(t.req.TaskID, text, time.Now())); err != nil {
		return err
	}
	s.metrics.StatusLines.Inc()
	return nil
}
