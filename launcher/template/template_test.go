package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
)

// A template's plan: its filter is the profile's template variant, loaded
// with a listener; its /proc an empty read-only tmpfs; its writable tmpfs
// mounts read-only; each call gets those fresh, and a proc.
func TestTemplatePlan(t *testing.T) {
	set, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"restrictive", "standard", "permissive"} {
		pl := rootPlan(t, set, name)
		tp := &Template{plan: pl}
		if err := tp.derivePolicies(set, name); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !pl.Child.SeccompListener || !strings.HasSuffix(pl.Child.SeccompPolicy, "-template") || len(tp.callFilter) == 0 {
			t.Errorf("%s: listener %v, policy %q, call filter %d bytes", name, pl.Child.SeccompListener, pl.Child.SeccompPolicy, len(tp.callFilter))
		}
		tp.planMounts()
		fresh := map[string]string{}
		for _, f := range tp.fresh {
			fresh[f.target] = f.fs
		}
		if fresh["/proc"] != "proc" || fresh["/tmp"] != "tmpfs" {
			t.Errorf("%s: fresh mounts %v, want /proc (proc) and /tmp (tmpfs)", name, fresh)
		}
		for _, m := range pl.Child.Mounts {
			switch {
			case tp.underFresh(m.Target):
				// The template could not make its mount point in the
				// read-only tmpfs (permissive: /var/run/secrets under /var).
				t.Errorf("%s: the template mounts %s (%s) under a mount each call gets fresh", name, m.Target, m.Kind)
			case m.Kind == nsinit.MountProc:
				t.Errorf("%s: the template has a proc mount at %s", name, m.Target)
			case m.Target == "/proc" && !(m.Kind == nsinit.MountTmpfs && m.ReadOnly):
				t.Errorf("%s: the template's /proc is %+v, want an empty read-only tmpfs", name, m)
			case m.Kind == nsinit.MountTmpfs && !m.ReadOnly && m.Target != "/dev":
				t.Errorf("%s: the template keeps writable tmpfs %s", name, m.Target)
			}
		}
	}
}

// smaps lines the template check accepts and refuses.
func TestCheckSmaps(t *testing.T) {
	mapping := func(head, flags string) string {
		return head + "\nSize:                  4 kB\nVmFlags: " + flags + "\n"
	}
	for _, c := range []struct {
		name, smaps string
		refused     bool
	}{
		{"private", mapping("7f00-7f01 r--p 00000000 00:1f 12 /usr/lib/libc.so.6", "rd mr mw me"), false},
		{"read-only shared file (gconv cache)", mapping("7f00-7f01 r--s 00000000 00:1f 13 /usr/lib/x86_64-linux-gnu/gconv/gconv-modules.cache", "rd sh mr me ms"), false},
		{"shared anonymous", mapping("7f00-7f01 rw-s 00000000 00:01 14 /dev/zero (deleted)", "rd wr sh mr mw me ms"), true},
		{"shared, read-only now, writable later", mapping("7f00-7f01 r--s 00000000 00:01 15 /tmp/x", "rd sh mr mw me ms"), true},
		{"private memfd", mapping("7f00-7f01 r--p 00000000 00:01 16 /memfd:channel (deleted)", "rd mr mw me"), true},
		{"/dev/shm file", mapping("7f00-7f01 r--p 00000000 00:1a 17 /dev/shm/x", "rd mr mw me"), true},
	} {
		if err := checkSmaps([]byte(c.smaps)); (err != nil) != c.refused {
			t.Errorf("%s: checkSmaps = %v, want refused %v", c.name, err, c.refused)
		}
	}
}

// setns and unshare (a past bug class: joining or making namespaces from
// a multi-threaded Go program) appear as calls only where allowed: the
// template's lo set-up (one locked thread, launcher/template/netns.go)
// and its id-map opener (a raw clone, launcher/template/mapper.go).
func TestSetnsOnlyWhereAllowed(t *testing.T) {
	allowed := map[string]bool{"launcher/template/netns.go": true, "launcher/template/mapper.go": true}
	call := regexp.MustCompile(`\b(unix|syscall)\.(Setns|Unshare)\(|RawSyscall6?\((unix|syscall)\.SYS_(SETNS|UNSHARE)\b`)
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "vendor" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if call.Match(b) && !allowed[filepath.ToSlash(rel)] {
			t.Errorf("%s calls setns or unshare: only %v may", rel, allowed)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !call.MatchString("unix.Setns(fd, 0)") || !call.MatchString("syscall.RawSyscall(unix.SYS_SETNS, 1, 2, 3)") {
		t.Error("the pattern misses a call")
	}
}

// A call's work dir target is an empty directory of the template's root,
// never under /proc, /dev or a mount each call gets fresh.
func TestTemplateWorkDirTarget(t *testing.T) {
	for target, ok := range map[string]bool{"/work": true, "/srv/call": true, "work": false, "/work/": false, "/": false,
		"/proc/x": false, "/dev": false, "/tmp/work": false, "/dev/shm/w": false} {
		pl := rootPlan(t, nil, "standard")
		tp := &Template{plan: pl}
		tp.planMounts()
		n := len(pl.Child.Mounts)
		err := tp.planWorkDir(target)
		if (err == nil) != ok {
			t.Errorf("%q: %v, want accepted %v", target, err, ok)
		}
		if ok && (len(pl.Child.Mounts) != n+1 || pl.Child.Mounts[n].Kind != nsinit.MountDir || pl.Child.Mounts[n].Target != target) {
			t.Errorf("%q: no directory planned for it", target)
		}
	}
}

// An answer whose header announces more than a template call's answer may
// have is the tool's result too large (AnswerTooLargeError, which the
// worker answers as it answers a cold call's oversized result.json), not
// a child that gave no answer; a header within bounds is read.
func TestRecvDocumentTooLarge(t *testing.T) {
	for _, c := range []struct {
		size     int
		tooLarge bool
	}{{maxTemplateMessage + 1, true}, {2, false}} {
		ours, theirs, err := launcher.SeqpacketPair("test", "test-peer")
		if err != nil {
			t.Fatal(err)
		}
		head := fmt.Sprintf(`{"type": "result", "size": %d}`, c.size)
		if _, err := theirs.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
		if !c.tooLarge {
			if _, err := theirs.Write([]byte("{}")); err != nil {
				t.Fatal(err)
			}
		}
		doc, err := recvDocument(ours, time.Minute)
		var tl *AnswerTooLargeError
		switch {
		case c.tooLarge && (!errors.As(err, &tl) || tl.Size != int64(c.size)):
			t.Errorf("size %d: %v, want an AnswerTooLargeError of %d bytes", c.size, err, c.size)
		case !c.tooLarge && (err != nil || string(doc) != "{}"):
			t.Errorf("size %d: %q, %v, want {}", c.size, doc, err)
		}
		ours.Close()
		theirs.Close()
	}
}

// A template takes calls until MaxCalls or MaxAge, each
// named as its retirement's reason.
func TestRecycleReason(t *testing.T) {
	for _, c := range []struct {
		calls int
		age   time.Duration
		want  RetireReason
	}{
		{1, 0, ""},
		{MaxCalls - 1, MaxAge - time.Second, ""},
		{MaxCalls, 0, RetiredCalls},
		{1, MaxAge, RetiredAge},
		{MaxCalls, MaxAge, RetiredCalls},
	} {
		if got := recycleReason(c.calls, c.age); got != c.want {
			t.Errorf("%d calls, %s old: %q, want %q", c.calls, c.age, got, c.want)
		}
	}
}

// rootPlan is profile's plan (of set; nil: the embedded profiles) for a
// root launcher on a cgroup v1 host, as a template's is before T1 changes it.
func rootPlan(t *testing.T, set *profiles.Set, profile string) *launcher.Plan {
	t.Helper()
	if set == nil {
		var err error
		if set, err = profiles.Embedded(); err != nil {
			t.Fatal(err)
		}
	}
	p, err := set.Lookup(profile)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := launcher.NewPlan(p, launcher.Request{Argv: []string{"/bin/true"}}, launcher.Host{Root: true, Cgroup: launcher.CgroupV1}, nil)
	if err != nil {
		t.Fatalf("plan %s: %v", profile, err)
	}
	return pl
}
