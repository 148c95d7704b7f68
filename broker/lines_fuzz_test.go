package broker

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"
)

// fuzzStream is the bytes a peer sends: data, then pad filler bytes
// without a newline (an over-long line the fuzzer need not spell out),
// handed out at most chunk bytes per Read. Reading allocates nothing.
type fuzzStream struct {
	data  []byte
	pad   int
	chunk int
}

func (s *fuzzStream) Read(p []byte) (int, error) {
	if len(p) > s.chunk {
		p = p[:s.chunk]
	}
	n := copy(p, s.data)
	s.data = s.data[n:]
	for n < len(p) && s.pad > 0 {
		p[n] = 'x'
		n++
		s.pad--
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// fuzzConn is a connection whose only working method is Read.
type fuzzConn struct {
	net.Conn
	r io.Reader
}

func (c fuzzConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// fuzzSegment is one line as the peer sent it: up to and including its
// '\n' (the last one may have none).
type fuzzSegment struct {
	raw        []byte
	terminated bool
}

func fuzzSegments(stream []byte) []fuzzSegment {
	var out []fuzzSegment
	for len(stream) > 0 {
		i := bytes.IndexByte(stream, '\n')
		if i < 0 {
			out = append(out, fuzzSegment{raw: stream})
			break
		}
		out = append(out, fuzzSegment{raw: stream[:i+1], terminated: true})
		stream = stream[i+1:]
	}
	return out
}

// FuzzLineReaders feeds one byte stream (seeds in
// testdata/fuzz/FuzzLineReaders) to both sides' line readers, the
// server's readLines and the client's readLine, under an arbitrary line
// bound, and checks each against the framing rule of spec §10: lines end
// at '\n' ("\r\n" tolerated); the server answers an over-long line with
// an error and goes on with the next one, the client gives up on the
// connection. Neither may hand over a line longer than the bound, nor
// buffer an over-long line: the bytes they allocate stay within a few
// times the bound, however long the line (pad bytes of filler).
func FuzzLineReaders(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, maxLine uint16, pad uint32, chunkSel uint8) {
		max := int(maxLine)
		chunk := 1 << (chunkSel % 17) // 1 B .. 64 KiB per Read
		n := int(pad % (1 << 21))     // up to 2 MiB of filler
		if n > chunk<<12 {
			n = chunk << 12 // bounded Read calls per input
		}
		stream := append(append([]byte(nil), data...), bytes.Repeat([]byte("x"), n)...)
		segs := fuzzSegments(stream)
		fuzzServerLines(t, data, n, chunk, max, segs)
		fuzzClientLines(t, data, n, chunk, max, segs)
	})
}

// allocBound is what reading segs may allocate: the 64 KiB read buffer,
// a fixed allowance, and per line a few times what it may keep (append
// grows a large buffer by 1.25x, so growing to n bytes allocates about
// 5n in all).
func allocBound(segs []fuzzSegment, max int) uint64 {
	b := uint64(128 << 10)
	for _, s := range segs {
		b += 256 + 6*uint64(min(len(s.raw), max+2))
	}
	return b
}

func fuzzServerLines(t *testing.T, data []byte, pad, chunk, max int, segs []fuzzSegment) {
	s := NewServer(Options{MaxLineBytes: max, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	eff := s.maxLine
	c := &conn{nc: fuzzConn{r: &fuzzStream{data: data, pad: pad, chunk: chunk}}, gone: make(chan struct{})}
	c.authed.Store(true) // the reader after CONNECT, under MaxLineBytes
	out := make(chan line)
	var got []line

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	go s.readLines(c, out, make(chan struct{}))
	for done := false; !done; {
		select {
		case l := <-out:
			got = append(got, l)
		case <-c.gone:
			done = true
		}
	}
	runtime.ReadMemStats(&after)

	if len(got) != len(segs) {
		t.Fatalf("server (max %d): %d lines from %d segments", eff, len(got), len(segs))
	}
	for i, seg := range segs {
		l := got[i]
		if len(l.data) > eff {
			t.Fatalf("server (max %d): line %d of %d bytes handed over", eff, i, len(l.data))
		}
		if cap(l.data) > 2*(eff+2)+64 {
			t.Fatalf("server (max %d): line %d of %d bytes kept in %d", eff, i, len(l.data), cap(l.data))
		}
		body := bytes.TrimRight(seg.raw, "\r\n")
		tooLong := len(seg.raw) > eff+2 || len(body) > eff
		if l.tooLong != tooLong || (!tooLong && !bytes.Equal(l.data, body)) {
			t.Fatalf("server (max %d): segment %d (%d bytes) read as %d bytes, tooLong %v", eff, i, len(seg.raw), len(l.data), l.tooLong)
		}
	}
	if a, b := after.TotalAlloc-before.TotalAlloc, allocBound(segs, eff); a > b {
		t.Fatalf("server (max %d): reading %d bytes allocated %d bytes (bound %d)", eff, len(data)+pad, a, b)
	}
}

func fuzzClientLines(t *testing.T, data []byte, pad, chunk, max int, segs []fuzzSegment) {
	eff := max
	if eff <= 0 {
		eff = DefaultMaxLineBytes // as NewClient defaults it
	}
	r := bufio.NewReaderSize(&fuzzStream{data: data, pad: pad, chunk: chunk}, 64<<10)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var lines [][]byte
	var err error
	for err == nil {
		var l []byte
		if l, err = ReadLine(r, eff); err == nil {
			lines = append(lines, l)
		}
	}
	runtime.ReadMemStats(&after)

	// The client reads whole lines until the first over-long or
	// unterminated one, which ends the connection. (Like the server it
	// may refuse a line whose body fits but whose "\r"s before the
	// newline do not.)
	want := 0
	for _, seg := range segs {
		if !seg.terminated || len(seg.raw) > eff+2 || len(bytes.TrimRight(seg.raw, "\r\n")) > eff {
			break
		}
		want++
	}
	if len(lines) != want {
		t.Fatalf("client (max %d): %d lines read, want %d (then %v)", eff, len(lines), want, err)
	}
	for i, l := range lines {
		if !bytes.Equal(l, segs[i].raw) {
			t.Fatalf("client (max %d): line %d is %q, sent %q", eff, i, l, segs[i].raw)
		}
		if body := bytes.TrimRight(l, "\r\n"); len(body) > eff {
			t.Fatalf("client (max %d): line %d of %d bytes accepted", eff, i, len(body))
		}
	}
	if a, b := after.TotalAlloc-before.TotalAlloc, allocBound(segs, eff); a > b {
		t.Fatalf("client (max %d): reading %d bytes allocated %d bytes (bound %d)", eff, len(data)+pad, a, b)
	}
}
