package proxy

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
)

// Bounds on the ClientHello read: TLS records carry at most 2^14 bytes of
// plaintext; a ClientHello (even with post-quantum key shares) fits in a few
// records.
const (
	maxTLSRecord     = 1 << 14
	maxClientHello   = 64 << 10
	recordTypeHShake = 0x16
	hsClientHello    = 0x01
	extServerName    = 0x0000
	sniHostName      = 0x00
)

var (
	errNotTLS         = errors.New("tls: not a handshake record")
	errBadClientHello = errors.New("tls: malformed ClientHello")
)

// peekClientHello reads the first TLS handshake message from r and returns
// every byte it consumed (to be sent upstream first) and the SNI host name
// ("" when the ClientHello has none). errNotTLS means the stream does not
// start with a handshake record; the consumed bytes are still returned.
func peekClientHello(r io.Reader) (consumed []byte, sni string, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:1]); err != nil {
		return nil, "", err
	}
	consumed = append(consumed, hdr[0])
	if hdr[0] != recordTypeHShake {
		return consumed, "", errNotTLS
	}
	var hs []byte
	first := true
	for {
		if !first {
			if _, err := io.ReadFull(r, hdr[:1]); err != nil {
				return consumed, "", err
			}
			consumed = append(consumed, hdr[0])
			if hdr[0] != recordTypeHShake {
				return consumed, "", errBadClientHello
			}
		}
		first = false
		if _, err := io.ReadFull(r, hdr[1:5]); err != nil {
			return consumed, "", err
		}
		consumed = append(consumed, hdr[1:5]...)
		if hdr[1] != 3 {
			return consumed, "", errBadClientHello
		}
		n := int(binary.BigEndian.Uint16(hdr[3:5]))
		if n == 0 || n > maxTLSRecord || len(hs)+n > maxClientHello {
			return consumed, "", errBadClientHello
		}
		start := len(consumed)
		consumed = append(consumed, make([]byte, n)...)
		if got, err := io.ReadFull(r, consumed[start:]); err != nil {
			// Only what was read: never the zeros of the unread rest.
			return consumed[:start+got], "", err
		}
		hs = append(hs, consumed[start:]...)
		if len(hs) >= 4 {
			if hs[0] != hsClientHello {
				return consumed, "", errBadClientHello
			}
			need := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
			if need > maxClientHello {
				return consumed, "", errBadClientHello
			}
			if len(hs) >= need {
				sni, err := parseClientHelloSNI(hs[:need])
				return consumed, sni, err
			}
		}
	}
}

// peekPassable reports whether a connection whose ClientHello peek ended
// with err may go on without an SNI check: it is not TLS at all, or the
// client sent nothing before the timeout (a protocol where the server speaks
// first). A handshake that started but could not be read within the bounds
// is not passed through unchecked.
func peekPassable(consumed []byte, err error) bool {
	if err == nil || errors.Is(err, errNotTLS) {
		return true
	}
	var ne net.Error
	return len(consumed) == 0 && errors.As(err, &ne) && ne.Timeout()
}

// parseClientHelloSNI returns the host_name of the server_name extension of
// a complete ClientHello handshake message (with its 4-byte header), or ""
// when there is none.
func parseClientHelloSNI(m []byte) (string, error) {
	b := byteReader{m}
	typ, ok1 := b.u8()
	n, ok2 := b.u24()
	if !ok1 || !ok2 || typ != hsClientHello || n != len(b.b) {
		return "", errBadClientHello
	}
	if !b.skip(2+32) || !b.skipVec8() || !b.skipVec16() || !b.skipVec8() {
		return "", errBadClientHello // version, random, session id, suites, compression
	}
	if len(b.b) == 0 {
		return "", nil // no extensions
	}
	exts, ok := b.vec16()
	if !ok || len(b.b) != 0 {
		return "", errBadClientHello
	}
	e := byteReader{exts}
	seen := false
	sni := ""
	for len(e.b) > 0 {
		typ, ok1 := e.u16()
		data, ok2 := e.vec16()
		if !ok1 || !ok2 {
			return "", errBadClientHello
		}
		if typ != extServerName {
			continue
		}
		if seen {
			return "", errBadClientHello // duplicate extension
		}
		seen = true
		d := byteReader{data}
		list, ok := d.vec16()
		if !ok || len(d.b) != 0 || len(list) == 0 {
			return "", errBadClientHello
		}
		l := byteReader{list}
		for len(l.b) > 0 {
			nt, ok1 := l.u8()
			name, ok2 := l.vec16()
			if !ok1 || !ok2 || len(name) == 0 {
				return "", errBadClientHello
			}
			if nt == sniHostName {
				if sni != "" {
					return "", errBadClientHello // two host names
				}
				sni = string(name)
			}
		}
	}
	return sni, nil
}

// byteReader is a bounds-checked cursor over a byte slice.
type byteReader struct{ b []byte }

func (r *byteReader) u8() (int, bool) {
	if len(r.b) < 1 {
		return 0, false
	}
	v := int(r.b[0])
	r.b = r.b[1:]
	return v, true
}

func (r *byteReader) u16() (int, bool) {
	if len(r.b) < 2 {
		return 0, false
	}
	v := int(binary.BigEndian.Uint16(r.b))
	r.b = r.b[2:]
	return v, true
}

func (r *byteReader) u24() (int, bool) {
	if len(r.b) < 3 {
		return 0, false
	}
	v := int(r.b[0])<<16 | int(r.b[1])<<8 | int(r.b[2])
	r.b = r.b[3:]
	return v, true
}

func (r *byteReader) skip(n int) bool {
	if len(r.b) < n {
		return false
	}
	r.b = r.b[n:]
	return true
}

func (r *byteReader) bytes(n int) ([]byte, bool) {
	if len(r.b) < n {
		return nil, false
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v, true
}

func (r *byteReader) vec16() ([]byte, bool) {
	n, ok := r.u16()
	if !ok {
		return nil, false
	}
	return r.bytes(n)
}

func (r *byteReader) skipVec8() bool {
	n, ok := r.u8()
	return ok && r.skip(n)
}

func (r *byteReader) skipVec16() bool {
	n, ok := r.u16()
	return ok && r.skip(n)
}
