package proxy

import (
	"hash/fnv"
	"net/netip"
	"sync"
)

// Fake IPs live in 127.1.0.0/16: inside the sandbox's network namespace all
// of 127/8 is local, so a connect() to one lands on the capture listener
// (0.0.0.0:P) with no route to add, and getsockname() of the accepted
// connection gives the fake IP back.
var fakePrefix = netip.MustParsePrefix("127.1.0.0/16")

// maxFakeNames bounds the table (allow_egress hands a fake IP to every valid
// name a tool looks up); one entry is well under 300 bytes.
const maxFakeNames = 16384

// fakeTable maps names to fake IPs and back. An IP, once given to a name,
// is never given to another name in the session: a client that cached it
// can only ever reach that name (the Clash fake-ip failure mode would send
// host A's credentials to host B).
type fakeTable struct {
	mu     sync.Mutex
	byName map[string]netip.Addr
	byIP   map[netip.Addr]string
}

func newFakeTable() *fakeTable {
	return &fakeTable{byName: make(map[string]netip.Addr), byIP: make(map[netip.Addr]string)}
}

// assign returns name's fake IP, allocating it on first use: the FNV-1a slot
// of the name, probing forward past taken slots. ok is false when the table
// is full.
func (t *fakeTable) assign(name string) (netip.Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a, ok := t.byName[name]; ok {
		return a, true
	}
	if len(t.byName) >= maxFakeNames {
		return netip.Addr{}, false
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	const slots = 65534 // 127.1.0.1 .. 127.1.255.254
	s := h.Sum32() % slots
	for i := uint32(0); i < slots; i++ {
		slot := (s+i)%slots + 1
		a := netip.AddrFrom4([4]byte{127, 1, byte(slot >> 8), byte(slot)})
		if _, taken := t.byIP[a]; !taken {
			t.byName[name], t.byIP[a] = a, name
			return a, true
		}
	}
	return netip.Addr{}, false
}

// lookup maps a fake IP back to its name.
func (t *fakeTable) lookup(a netip.Addr) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.byIP[a.Unmap()]
	return n, ok
}
