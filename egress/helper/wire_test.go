package helper

import (
	"net"
	"os"
	"testing"

	"github.com/securetoolruntime/str/egress"
	"golang.org/x/sys/unix"
)

// TestWireRoundTrip: a message and its descriptors cross the socketpair
// whole; a credential's value crosses in the clear (egress.Secret alone
// would marshal as "[redacted]") and comes back a Secret.
func TestWireRoundTrip(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "end")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b := conn(fds[0]), conn(fds[1])
	defer a.Close()
	defer b.Close()

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	creds := []egress.Credential{{Name: "API_TOKEN", Hosts: []string{"api.example.com"}, Header: "Authorization", Value: egress.NewSecret([]byte("s3cret")), Placeholder: "str-placeholder-x"}}
	out := Message{Op: OpStart, ID: 7, Session: 3, Policy: &egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.example.com"}},
		Credentials: wireCredentials(creds), Listeners: []string{"proxy"}}
	if err := Send(a, out, []int{int(w.Fd())}); err != nil {
		t.Fatal(err)
	}
	in, files, err := Recv(b, make([]byte, MaxMessage))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 {
		t.Fatalf("%d descriptors, want 1", len(files))
	}
	defer files[0].Close()
	if in.Op != OpStart || in.ID != 7 || in.Session != 3 || in.Policy == nil || in.Policy.AllowedHosts[0] != "api.example.com" || in.Listeners[0] != "proxy" {
		t.Errorf("received %+v", in)
	}
	back := EgressCredentials(in.Credentials)
	if len(back) != 1 || string(back[0].Value.Bytes()) != "s3cret" || back[0].Placeholder != "str-placeholder-x" {
		t.Errorf("credentials %+v", back)
	}
	// The descriptor is the pipe's write end.
	if _, err := files[0].Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if n, err := r.Read(buf); n != 1 || err != nil {
		t.Errorf("read %d %v", n, err)
	}

	// The peer's close is net.ErrClosed.
	a.Close()
	if _, _, err := Recv(b, make([]byte, 64)); err != net.ErrClosed {
		t.Errorf("after close: %v, want net.ErrClosed", err)
	}
}
