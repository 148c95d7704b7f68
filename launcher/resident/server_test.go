package resident

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"golang.org/x/sys/unix"
)

// planLauncher is a Launcher of this host with the embedded profiles:
// planning needs no privilege.
func planLauncher(t testing.TB) *launcher.Launcher {
	t.Helper()
	l, err := launcher.New(launcher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestResidentPoolable: check 4 of str serve. A call whose plan is the
// pre-built one's but for argv, environment and a shorter wall clock is
// poolable; lower limits, a narrower network, a bind or a work dir are
// not, each named.
func TestResidentPoolable(t *testing.T) {
	l := planLauncher(t)
	dir := t.TempDir() // a bind source and a work dir that exist
	tmplReq := launcher.Request{Profile: "standard", AwaitCall: true, Idle: time.Minute}
	tmpl, err := l.Plan(tmplReq)
	if err != nil {
		t.Fatal(err)
	}
	p := &residentPool{name: "standard", req: tmplReq, tmpl: tmpl}
	for _, c := range []struct {
		req  launcher.Request
		want string // "" poolable, else a word of the reason
	}{
		{launcher.Request{Argv: []string{"/bin/echo", "hi"}}, ""},
		{launcher.Request{Argv: []string{"python3"}, Env: []string{"A=1"}, Timeout: 5 * time.Second}, ""},
		{launcher.Request{Profile: "standard", Argv: []string{"/bin/true"}}, ""},
		{launcher.Request{Argv: []string{"/bin/true"}, Memory: 100 << 20}, "cgroup"},
		{launcher.Request{Argv: []string{"/bin/true"}, Pids: 4}, "cgroup"},
		{launcher.Request{Argv: []string{"/bin/true"}, Network: &egress.Policy{Mode: egress.Isolated}}, "network"},
		{launcher.Request{Argv: []string{"/bin/true"}, Binds: []launcher.Bind{{Source: dir}}}, "mounts"},
		{launcher.Request{Argv: []string{"/bin/true"}, Workdir: dir}, "mounts"},
	} {
		if c.req.Profile == "" {
			c.req.Profile = "standard"
		}
		pl, err := l.Plan(c.req)
		if err != nil {
			t.Fatalf("%+v: %v", c.req, err)
		}
		got := p.differs(pl)
		if (got == "") != (c.want == "") || !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want %q", c.req, got, c.want)
		}
	}
}

// TestRefusalLogRateLimited: check 2's log (issue 29, item 7). A uid
// refused many times gets one line per refusalLogInterval, the next
// carrying how many went unlogged; each uid has its own; once
// refusalLogUIDs uids are remembered, new ones share one overflow line.
func TestRefusalLogRateLimited(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var rl refusalLog
	t0 := time.Unix(1_000_000, 0)
	lines := 0
	for i := 0; i < 10_000; i++ {
		if rl.note(log, &unix.Ucred{Uid: 1234, Pid: int32(i)}, t0.Add(time.Duration(i)*time.Millisecond)) {
			lines++
		}
	}
	// 10 s of refusals, one per ms: the first line, then one at 10 s
	// (i = 10,000 is past the loop).
	if lines != 1 || strings.Count(buf.String(), "\n") != 1 {
		t.Fatalf("10,000 refusals within one interval: %d lines:\n%s", lines, buf.String())
	}
	buf.Reset()
	if !rl.note(log, &unix.Ucred{Uid: 1234}, t0.Add(refusalLogInterval)) || !strings.Contains(buf.String(), "refused_unlogged=9999") {
		t.Errorf("the next interval's line: %q, want refused_unlogged=9999", buf.String())
	}
	if !rl.note(log, &unix.Ucred{Uid: 4321}, t0.Add(refusalLogInterval)) {
		t.Error("another uid's first refusal was not logged")
	}
	// Many uids: memory and lines bounded by refusalLogUIDs and the
	// overflow entry.
	lines = 0
	now := t0.Add(2 * refusalLogInterval)
	for u := uint32(0); u < 3*refusalLogUIDs; u++ {
		if rl.note(log, &unix.Ucred{Uid: 10_000 + u}, now) {
			lines++
		}
	}
	if len(rl.byUID) > refusalLogUIDs+1 || lines > refusalLogUIDs+1 {
		t.Errorf("%d uids refused at once: %d remembered, %d lines; want at most %d of each", 3*refusalLogUIDs, len(rl.byUID), lines, refusalLogUIDs+1)
	}
}
