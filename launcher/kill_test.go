package launcher

import (
	"context"
	"errors"
	"os"
	"runtime/debug"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// openFDs is the number of descriptors this process holds.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestKillBeforeStartReleases: a sandbox created and killed without ever
// starting gives back its report socket at once (it and the config pipe
// leaked four descriptors a sandbox until the garbage collector ran
// their finalizers), and Start, Arm and Wait say it has ended.
func TestKillBeforeStartReleases(t *testing.T) {
	if os.Geteuid() != 0 {
		const why = "creating a sandbox in root mode (a leased host id block and a cgroup) needs root"
		mustwork.Skip(t, why)
	}
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Profile: "restrictive", Argv: []string{"/bin/true"}}
	cycle := func() *Sandbox {
		t.Helper()
		s, err := l.Create(context.Background(), req)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if err := s.Kill(); err != nil {
			t.Fatalf("kill before start: %v", err)
		}
		return s
	}
	// No finalizer may close a leaked descriptor behind the count's back.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// The first sandbox opens what every later one shares (the init's
	// sealed memfd, the cgroup parent, the egress helper's control socket
	// and pidfd): not counted.
	cycle()
	if err := l.egress.Ready(); err != nil {
		t.Fatal(err)
	}
	before := openFDs(t)
	var s *Sandbox
	for range 10 {
		s = cycle()
	}
	if after := openFDs(t); after != before {
		t.Errorf("10 create+kill cycles: %d descriptors before, %d after (want no change)", before, after)
	}
	if err := s.Start(); !errors.Is(err, ErrEnded) {
		t.Errorf("Start after Kill: %v, want ErrEnded", err)
	}
	if _, err := s.Wait(); !errors.Is(err, ErrEnded) {
		t.Errorf("Wait after Kill before Start: %v, want ErrEnded", err)
	}
	if err := s.Kill(); err != nil {
		t.Errorf("a second Kill: %v", err)
	}
}
