package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// Root mode: every bind and device node is cloned by the launcher and
// numbered from the first descriptor after the report socket, in plan
// order, exactly the order cloneBindSources passes them in. Rootless: the
// init clones them (TreeFD 0). The work dir alone refuses a symlink.
func TestPlanTreeDescriptors(t *testing.T) {
	pass := []*os.File{os.Stdin, os.Stdin}
	req := Request{Workdir: "/work", Binds: []Bind{{Source: "/data"}}, ExtraFiles: pass}
	for _, rootless := range []bool{false, true} {
		uid := 0
		if rootless {
			uid = 1000
		}
		pl := mustPlan(t, "standard", req, fakeHost(uid, CgroupV1))
		next := nsinit.FirstTreeFD(len(pass))
		if next != 7 {
			t.Fatalf("FirstTreeFD(2) = %d: 0-2, the pass-list (3, 4), config (5) and report (6) come first", next)
		}
		sources := 0
		for _, m := range pl.Child.Mounts {
			if !hasSource(m) {
				if m.TreeFD != 0 || m.NoFollow {
					t.Errorf("%s mount %s has tree_fd %d no_follow %v", m.Kind, m.Target, m.TreeFD, m.NoFollow)
				}
				continue
			}
			sources++
			want := 0
			if !rootless {
				want = next
				next++
			}
			if m.TreeFD != want {
				t.Errorf("rootless=%v: %s tree_fd %d, want %d", rootless, m.Source, m.TreeFD, want)
			}
			if m.NoFollow != (m.Target == "/work") {
				t.Errorf("%s: no_follow %v; only the work dir refuses a symlink", m.Target, m.NoFollow)
			}
		}
		if sources < 8 || (!rootless && next >= nsinit.MaxInitFDs) {
			t.Errorf("rootless=%v: %d sources, last tree fd %d (limit %d)", rootless, sources, next-1, nsinit.MaxInitFDs)
		}
		owned := mustPlan(t, "standard", Request{Workdir: "/work", WorkdirAsOwner: true}, fakeHost(uid, CgroupV1))
		for _, m := range owned.Child.Mounts {
			if m.IDMapOwner != (m.Target == "/work" && !rootless) {
				t.Errorf("rootless=%v: %s id_map_owner %v; only the work dir, only as root", rootless, m.Target, m.IDMapOwner)
			}
		}
		for _, m := range pl.Child.Mounts {
			if m.IDMapOwner {
				t.Errorf("%s id-mapped without WorkdirAsOwner", m.Target)
			}
			if m.WriteBack != (m.Target == "/work" && !rootless) {
				t.Errorf("rootless=%v: %s write_back %v; only the work dir, only as root", rootless, m.Target, m.WriteBack)
			}
		}
		live := mustPlan(t, "standard", Request{Workdir: "/work", WorkdirLive: true}, fakeHost(uid, CgroupV1))
		for _, m := range live.Child.Mounts {
			if m.WriteBack {
				t.Errorf("%s write_back with WorkdirLive", m.Target)
			}
		}
	}
}

// The descriptor limits are the plan's, collected with every other
// problem: one number for the pass-list (the init checks the same), one
// for the bind sources.
func TestPlanDescriptorLimits(t *testing.T) {
	many := make([]*os.File, nsinit.MaxPassFDs+1)
	var binds []Bind
	for i := 0; i < nsinit.MaxBindSources; i++ {
		binds = append(binds, Bind{Source: "/data", Target: "/b/" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)})
	}
	set, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Lookup("standard")
	_, err = NewPlan(p, Request{Argv: []string{"/bin/true"}, ExtraFiles: many, Binds: binds}, fakeHost(0, CgroupV1), nil)
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("want ErrInvalidRequest, got %v", err)
	}
	for _, w := range []string{"65 descriptors to pass, at most 64", fmt.Sprintf("bind mounts (binds and /dev's nodes), at most %d (the init's table", nsinit.MaxBindSources)} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
	if _, err := NewPlan(p, Request{Argv: []string{"/bin/true"}, ExtraFiles: many[:nsinit.MaxPassFDs]}, fakeHost(0, CgroupV1), nil); err != nil {
		t.Fatalf("%d descriptors refused: %v", nsinit.MaxPassFDs, err)
	}
	// No low limit of its own (bubblewrap has none): 400 sources pass
	// when RLIMIT_NOFILE allows, and the error names that limit when not.
	host := fakeHost(0, CgroupV1)
	host.NoFile = 1024
	if _, err := NewPlan(p, Request{Argv: []string{"/bin/true"}, Binds: binds[:300]}, host, nil); err != nil {
		t.Errorf("300 binds with RLIMIT_NOFILE 1024: %v", err)
	}
	_, err = NewPlan(p, Request{Argv: []string{"/bin/true"}, Binds: binds[:400]}, host, nil)
	if want := "above the launcher's RLIMIT_NOFILE 1024: raise it"; !errors.Is(err, ErrInvalidRequest) || !strings.Contains(fmt.Sprint(err), want) {
		t.Errorf("400 binds with RLIMIT_NOFILE 1024: %v, want %q", err, want)
	}
}

// An optional source gone between the plan and Start is skipped: it is
// marked absent and the trees after it move down, in a copy (the plan is
// not changed). A symlinked work dir is refused at L3 with the step and
// path. Neither needs privilege: both end before open_tree.
func TestCloneBindSourcesAbsentAndSymlink(t *testing.T) {
	dir := t.TempDir()
	ms := []nsinit.Mount{
		{Kind: nsinit.MountBind, Source: filepath.Join(dir, "gone"), Target: "/a", Optional: true},
		{Kind: nsinit.MountFile, Target: "/etc/hosts"},
		{Kind: nsinit.MountBind, Source: filepath.Join(dir, "gone2"), Target: "/b", Optional: true},
	}
	numberTrees(ms, 5)
	if ms[0].TreeFD != 5 || ms[1].TreeFD != 0 || ms[2].TreeFD != 6 {
		t.Fatalf("numbering: %+v", ms)
	}
	trees, out, _, err := cloneBindSources(ms, 5, ownerMap{}, profiles.WorkDir{})
	if err != nil || len(trees) != 0 {
		t.Fatalf("absent optional sources: %v, %d trees", err, len(trees))
	}
	if out[0].TreeFD != nsinit.SourceAbsent || out[2].TreeFD != nsinit.SourceAbsent || ms[0].TreeFD != 5 {
		t.Fatalf("want both marked absent in a copy: out %+v, plan %+v", out, ms)
	}

	real := filepath.Join(dir, "real")
	link := filepath.Join(dir, "link")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	ms = []nsinit.Mount{{Kind: nsinit.MountBind, Source: link, Target: "/w", NoFollow: true, TreeFD: 5}}
	_, _, _, err = cloneBindSources(ms, 5, ownerMap{}, profiles.WorkDir{})
	var se *StepError
	if !errors.As(err, &se) || se.Step != nsinit.StepLBindSources || se.Path != link || !errors.Is(err, nsinit.ErrSymlinkSource) ||
		!strings.Contains(err.Error(), "launcher: clone bind source "+link+" (step L3, open O_PATH|O_NOFOLLOW)") {
		t.Fatalf("symlinked work dir: %v", err)
	}
	// A missing source that is not optional is an error naming it.
	ms = []nsinit.Mount{{Kind: nsinit.MountBind, Source: filepath.Join(dir, "gone"), Target: "/w", TreeFD: 5}}
	if _, _, _, err = cloneBindSources(ms, 5, ownerMap{}, profiles.WorkDir{}); !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("missing source: %v", err)
	}
}
