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
