package idmap

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// The work dir's detached tree is id-mapped owner -> tool (step L3,
// MapOwner): through it the owner's files are the tool's host ids,
// other ids unmapped (the overflow id); the namespace's process is gone
// when MapOwner returns. A root-owned tree is refused, and so are ids
// that are not leased.
func TestMapOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "id-mapping a detached tree (open_tree, mount_setattr) needs root")
	}
	const owner, group, toolUID, toolGID = 1000, 1001, 300000, 300001
	work := filepath.Join(t.TempDir(), "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]int{"owners": owner, "others": 2000} {
		if err := os.WriteFile(filepath.Join(work, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(work, name), id, id+1); err != nil {
			t.Fatal(err)
		}
	}
	clone := func() int {
		t.Helper()
		tree, err := unix.OpenTree(unix.AT_FDCWD, work, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			t.Fatalf("clone %s: %v", work, err)
		}
		return tree
	}

	// Root's work dir: refused, naming the owner.
	tree := clone()
	err := MapOwner(tree, work, toolUID, toolGID)
	unix.Close(tree)
	if err == nil || !strings.Contains(err.Error(), "owner 0:0") {
		t.Fatalf("root-owned work dir: %v, want refused naming owner 0:0", err)
	}
	if err := os.Chown(work, owner, group); err != nil {
		t.Fatal(err)
	}
	// Ids that are not leased (host root): refused.
	tree = clone()
	err = MapOwner(tree, work, 0, 0)
	unix.Close(tree)
	if err == nil || !strings.Contains(err.Error(), "not leased") {
		t.Fatalf("tool ids 0:0: %v, want refused", err)
	}

	before := children(t)
	tree = clone()
	defer unix.Close(tree)
	if err := MapOwner(tree, work, toolUID, toolGID); err != nil {
		t.Fatal(err)
	}
	for p := range children(t) {
		if !before[p] {
			t.Errorf("child %s outlived MapOwner", p)
		}
	}
	for name, want := range map[string][2]uint32{"owners": {toolUID, toolGID}, "others": {65534, 65534}, ".": {toolUID, toolGID}} {
		var st unix.Stat_t
		if err := unix.Fstatat(tree, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
		if [2]uint32{st.Uid, st.Gid} != want {
			t.Errorf("%s through the id-mapped tree: %d:%d, want %d:%d", name, st.Uid, st.Gid, want[0], want[1])
		}
	}
}

// children lists the pids of this process's children (every thread's).
func children(t *testing.T) map[string]bool {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]bool{}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, fs.ErrNotExist) { // a thread that has ended
			t.Fatal(err)
		}
		for _, p := range strings.Fields(string(b)) {
			pids[p] = true
		}
	}
	return pids
}

// MapRoot maps host root to the sandbox's root's host ids on every mount
// of a tree whose filesystem allows it: root's files are those ids
// through it, other ids unmapped (the overflow id). A tree whose own
// filesystem refuses (sysfs) is left as it is, reported, not an error;
// ids that are not leased are refused.
func TestMapRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "id-mapping a detached tree (open_tree, mount_setattr) needs root")
	}
	const rootUID, rootGID = 300000, 300001
	dir := t.TempDir()
	for name, id := range map[string]int{"roots": 0, "others": 2000} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(dir, name), id, id); err != nil {
			t.Fatal(err)
		}
	}
	clone := func(path string) int {
		t.Helper()
		tree, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			t.Fatalf("clone %s: %v", path, err)
		}
		return tree
	}
	if _, err := RootMapping(0, 0); err == nil || !strings.Contains(err.Error(), "not leased") {
		t.Fatalf("host ids 0:0: %v, want refused", err)
	}
	root, err := RootMapping(rootUID, rootGID)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	tree := clone(dir)
	defer unix.Close(tree)
	if left, err := MapRoot(tree, dir, root); err != nil || len(left) != 0 {
		t.Fatalf("MapRoot %s: left %q, %v", dir, left, err)
	}
	for name, want := range map[string][2]uint32{"roots": {rootUID, rootGID}, "others": {65534, 65534}} {
		var st unix.Stat_t
		if err := unix.Fstatat(tree, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
		if [2]uint32{st.Uid, st.Gid} != want {
			t.Errorf("%s through the id-mapped tree: %d:%d, want %d:%d", name, st.Uid, st.Gid, want[0], want[1])
		}
	}
	// sysfs refuses id-mapped mounts: left as it is, said.
	sys := clone("/sys")
	defer unix.Close(sys)
	left, err := MapRoot(sys, "/sys", root)
	if err != nil || len(left) == 0 || left[0] != "." {
		t.Fatalf("MapRoot /sys: left %q, %v; want . first", left, err)
	}
	t.Logf("left as they are below /sys: %q", left)
	var st unix.Stat_t
	if err := unix.Fstat(sys, &st); err != nil || st.Uid != 0 {
		t.Errorf("/sys's own mount: uid %d, %v; want 0 (not mapped)", st.Uid, err)
	}
}
