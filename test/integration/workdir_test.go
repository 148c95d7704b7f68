package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/launcher/writeback"
)

// privateChain makes base/inner, both mode 0700 and owned by root, as
// `mktemp -d` makes them: no other uid can search either. Everything a
// test puts under inner is reachable only through the launcher, which
// clones each bind source on the host (launcher step L3).
func privateChain(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("", "str-0700-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	inner := filepath.Join(base, "inner")
	if err := os.Mkdir(inner, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{base, inner} {
		if err := os.Chmod(d, 0o700); err != nil { // whatever the umask
			t.Fatal(err)
		}
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: want mode 0700: %v %v", d, st.Mode(), err)
		}
	}
	return inner
}

// A `str run` work dir and a read-only bind whose parents no other uid can
// search: the sandbox's init (an unprivileged host uid of its own) could
// not reach them by path; the launcher clones them on the host and hands
// the init the trees.
func TestWorkDirUnderPrivateParent(t *testing.T) {
	needRoot(t)
	inner := privateChain(t)
	wd := filepath.Join(inner, "wd")
	tools := filepath.Join(inner, "tools")
	for _, d := range []string{wd, tools} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(wd, 0o777); err != nil { // the tool's leased uid writes here
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tools, "data.txt"), []byte("from the tools dir\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(inner, "secret.txt"), []byte("host only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := sh(t, "standard", `pwd; cat `+tools+`/data.txt; echo written > out.txt; echo; ls `+inner,
		"--workdir", wd, "--ro-bind", tools)
	if want := wd + "\nfrom the tools dir\n\ntools\nwd\n"; r.Stdout != want {
		t.Fatalf("stdout %q, want %q: the work dir as cwd, the tools file, and in the private parent only the two mount points", r.Stdout, want)
	}
	got, err := os.ReadFile(filepath.Join(wd, "out.txt"))
	if err != nil || string(got) != "written\n" {
		t.Fatalf("the tool's file on the host: %q %v", got, err)
	}

	// What still cannot work is named: a work dir the tool's uid cannot
	// search fails at step 8 with the path and a hint, not at a parent.
	closed := filepath.Join(inner, "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	r = str(t, "--workdir", closed, "--", "/bin/true")
	if r.Exit != 125 || r.Res.SetupError == nil || r.Res.SetupError.Step != 8 || r.Res.SetupError.Path != closed ||
		!strings.Contains(r.Stderr, "hint: the work dir itself must be searchable") {
		t.Fatalf("exit %d, setup error %+v, stderr %q: want step 8 at %s with the hint", r.Exit, r.Res.SetupError, r.Stderr, closed)
	}

	// A work dir that is a symlink is refused, not followed.
	link := filepath.Join(inner, "link")
	if err := os.Symlink(wd, link); err != nil {
		t.Fatal(err)
	}
	r = str(t, "--workdir", link, "--", "/bin/true")
	if r.Exit != 125 || !strings.Contains(r.Stderr, "is a symlink") {
		t.Fatalf("symlinked work dir: exit %d, stderr %q", r.Exit, r.Stderr)
	}
}

// The worker with SANDBOX_WORK_DIR, the tools dir, the runner and site
// dirs and the artifact store all under a 0700 mktemp chain starts (its
// probe sandbox binds a work dir there) and serves calls, cold and from
// its warm pool.
func TestWorkerUnderPrivateParent(t *testing.T) {
	needRoot(t)
	inner := privateChain(t)
	tools := filepath.Join(inner, "tools")
	if err := os.Mkdir(tools, 0o755); err != nil {
		t.Fatal(err)
	}
	const tool = `import os

def write_here(ctx, text="hi"):
    with open("note.txt", "w") as f:
        f.write(text)
    with open("note.txt") as f:
        back = f.read()
    return {"cwd": os.getcwd(), "read_back": back}
`
	if err := os.WriteFile(filepath.Join(tools, "private_tools.py"), []byte(tool), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(inner, "manifest.yaml")
	if err := os.WriteFile(manifest, []byte(`version: 1
tools:
  write_cold: {module: private_tools, function: write_here, timeout_seconds: 60}
  write_warm: {module: private_tools, function: write_here, timeout_seconds: 60, warm: 1}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(inner, "work")
	broker, health := freeTCPPort(t), freeTCPPort(t)
	w := startWorker(t, broker, health, map[string]string{
		"SAM_NAMESPACE": "it/", "MANIFEST_PATH": manifest, "TOOLS_PYTHON_DIR": tools,
		"SANDBOX_WORK_DIR": work, "STR_RUNNER_DIR": filepath.Join(inner, "runner"), "STR_SITE_DIR": filepath.Join(inner, "site"),
		"ARTIFACT_SERVICE_TYPE": "filesystem", "ARTIFACT_BASE_PATH": filepath.Join(inner, "artifacts"),
	})
	for _, name := range []string{"write_cold", "write_warm"} {
		r, out := invoke(t, broker, name, `{"text": "private parent"}`)
		if r.Result == nil || r.Result.TimedOut || r.Result.ToolResult["read_back"] != "private parent" ||
			!strings.HasPrefix(fmt.Sprint(r.Result.ToolResult["cwd"]), work+"/") {
			t.Fatalf("%s: want the text read back from a work dir under %s; output:\n%s\nworker log:\n%s", name, work, out, w.log.String())
		}
	}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

type worker struct {
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	done chan struct{}
}

// startWorker runs `str worker --embedded-broker` with vars and waits
// (generously) until /readyz answers 200, or the worker exits.
func startWorker(t *testing.T, broker, health int, vars map[string]string) *worker {
	t.Helper()
	w := &worker{log: &syncbuf.Buffer{}, done: make(chan struct{})}
	w.cmd = exec.Command(strBin, "worker", "--embedded-broker", "127.0.0.1:"+strconv.Itoa(broker))
	w.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HEALTH_PORT=" + strconv.Itoa(health), "STR_LOG_LEVEL=info"}
	for k, v := range vars {
		w.cmd.Env = append(w.cmd.Env, k+"="+v)
	}
	w.cmd.Stdout, w.cmd.Stderr = w.log, w.log
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-w.done:
		case <-time.After(60 * time.Second):
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	})
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", health)
	ready := eventually(90*time.Second, func() bool {
		select {
		case <-w.done:
			return true
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	select {
	case <-w.done:
		t.Fatalf("the worker exited before it was ready:\n%s", w.log.String())
	default:
	}
	if !ready {
		t.Fatalf("the worker was not ready within 90 s:\n%s", w.log.String())
	}
	return w
}

// reply is what str invoke prints last: the worker's reply.
type reply struct {
	Result *struct {
		ToolResult map[string]any `json:"tool_result"`
		TimedOut   bool           `json:"timed_out"`
	} `json:"result"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// invoke calls tool through `str invoke` and returns the reply (its last
// line of output) and the whole output.
func invoke(t *testing.T, broker int, tool, args string) (reply, string) {
	t.Helper()
	var r reply
	out := invokeInto(t, broker, tool, args, &r)
	return r, out
}

// invokeInto calls tool through `str invoke` with extra flags, decodes
// the reply (its last line of output) into r and returns the whole
// output.
func invokeInto(t *testing.T, broker int, tool, args string, r any, extra ...string) string {
	t.Helper()
	cmd := exec.Command(strBin, append([]string{"invoke", tool, "--broker", "127.0.0.1:" + strconv.Itoa(broker),
		"--namespace", "it/", "--args", args, "--wait", "3m"}, extra...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil && cmd.ProcessState == nil {
		t.Fatalf("str invoke: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), r); err != nil {
		t.Fatalf("str invoke %s: exit %d, last line is not a reply (%v):\n%s", tool, cmd.ProcessState.ExitCode(), err, out.String())
	}
	return out.String()
}

// A bind source on a shared mount (systemd makes / shared): the
// launcher's clone of it would be a peer of the host's mount, and a mount
// the init makes under it (here a nested bind) would then appear on the
// host. The clone is made private before it is attached, so nothing
// crosses. The "host" is a mount namespace of its own made by unshare(1),
// so the test changes nothing of the machine's or its own mounts.
func TestBindsDoNotPropagateToHost(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		mustwork.Skip(t, "needs unshare(1) (util-linux) to make a mount namespace with a shared mount")
	}
	dir := privateChain(t)
	shared := filepath.Join(dir, "shared")
	nested := filepath.Join(dir, "nested")
	for _, d := range []string{shared, nested} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Inside the new namespace: a shared tmpfs holding outer/inner; the
	// sandbox binds outer at /data and another directory at /data/inner,
	// so the init attaches the second tree inside the first. Then the
	// namespace's own mount table is printed.
	script := `set -e
mount -t tmpfs -o size=1m str-shared "$1"
mount --make-shared "$1"
mkdir -p "$1/outer/inner"
"$2" run --bind "$1/outer:/data" --ro-bind "$3:/data/inner" -- /bin/ls /data
echo ---
cat /proc/self/mountinfo`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", shared, strBin, nested)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("unshare: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	before, after, ok := strings.Cut(out.String(), "---\n")
	if !ok || strings.TrimSpace(before) != "inner" {
		t.Fatalf("the sandbox should list /data as [inner]; stdout before the mount table: %q; stderr:\n%s", before, errb.String())
	}
	for _, line := range strings.Split(after, "\n") {
		if strings.Contains(line, shared+"/outer") {
			t.Fatalf("a mount the sandbox made appeared outside it:\n%s", line)
		}
	}
	if !strings.Contains(after, shared) {
		t.Fatalf("the namespace's mount table does not show the shared tmpfs at %s:\n%s", shared, after)
	}
}

// str run --workdir DIR (root mode): DIR, owned by an unprivileged user
// and writable only by it (0755), is bound id-mapped so that its owner is
// the tool inside: the tool writes there, and its files belong to the
// owner on the host (issue 18 §2: before, the tool's leased uid got
// "Permission denied"). Files of other owners stay someone else's. A
// root-owned DIR is not mapped (no tool creates root's files): a 0755 one
// is read but not written, a 1777 one gets the tool's own leased ids.
// --workdir-owner, once the opt-in, is still accepted.
func TestWorkdirOwnerIDMapped(t *testing.T) {
	needRoot(t)
	inner := privateChain(t)
	wd := filepath.Join(inner, "wd")
	if err := os.Mkdir(wd, 0o755); err != nil {
		t.Fatal(err)
	}
	const owner, group = 4242, 4343
	theirs := filepath.Join(wd, "theirs.txt")
	if err := os.WriteFile(theirs, []byte("someone else's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path     string
		uid, gid int
	}{{wd, owner, group}, {theirs, 5555, 5555}} {
		if err := os.Chown(c.path, c.uid, c.gid); err != nil {
			t.Fatal(err)
		}
	}

	// The old opt-in flag is accepted and changes nothing.
	r := str(t, "--workdir", wd, "--workdir-owner", "--", "/bin/sh", "-c", "echo x > plain.txt")
	if r.Exit != 0 {
		t.Fatalf("--workdir-owner: exit %d, stderr %q", r.Exit, r.Stderr)
	}

	script := `set -e; [ "$(stat -c %u:%g .)" = "$(id -u):$(id -g)" ]; echo mine > out.txt; mkdir sub; echo nested > sub/n.txt
if echo x >> theirs.txt 2>/dev/null; then echo WROTE_THEIRS; fi; echo done`
	r = sh(t, "standard", script, "--workdir", wd)
	if strings.Contains(r.Stdout, "WROTE_THEIRS") || !strings.Contains(r.Stdout, "done") {
		t.Fatalf("stdout %q: the tool must own the dir and not another owner's file", r.Stdout)
	}
	for _, p := range []string{"plain.txt", "out.txt", "sub", "sub/n.txt"} {
		st, err := os.Lstat(filepath.Join(wd, p))
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if int(sys.Uid) != owner || int(sys.Gid) != group {
			t.Errorf("%s on the host: owner %d:%d, want the work dir's %d:%d", p, sys.Uid, sys.Gid, owner, group)
		}
	}

	// A root-owned 0755 work dir: read, not written, nothing of root's made.
	rootwd := filepath.Join(inner, "rootwd")
	if err := os.Mkdir(rootwd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootwd, "in.txt"), []byte("input\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = sh(t, "standard", `cat in.txt; if echo x > root.txt 2>/dev/null; then echo WROTE; fi; echo done`, "--workdir", rootwd)
	if r.Stdout != "input\ndone\n" {
		t.Fatalf("root-owned 0755 work dir: stdout %q stderr %q", r.Stdout, r.Stderr)
	}
	if _, err := os.Lstat(filepath.Join(rootwd, "root.txt")); !os.IsNotExist(err) {
		t.Fatalf("a file appeared in the root-owned 0755 dir: %v", err)
	}
	// A root-owned 1777 one: the tool's files are its own leased ids.
	if err := os.Chmod(rootwd, 0o1777); err != nil {
		t.Fatal(err)
	}
	r = sh(t, "standard", `echo x > tool.txt; echo done`, "--workdir", rootwd)
	if u := hostUID(t, filepath.Join(rootwd, "tool.txt")); u == 0 || u == owner || !strings.Contains(r.Stdout, "done") {
		t.Fatalf("a tool's file in a root-owned 1777 dir: host uid %d (stdout %q)", u, r.Stdout)
	}
}

// str run --workdir DIR (root mode) caps the tool's writes like a
// worker's work dir (issue 18 §2): the restrictive profile's work_dir
// is 256 MiB, so a tool writing 60 MiB files (under its 64 MiB
// RLIMIT_FSIZE) meets ENOSPC before a fifth is whole; it can still
// remove them and leave an answer. What the tool changed reaches DIR once
// the sandbox has ended (step L10), owned by DIR's owner: a new file, an
// appended one, a removed one, a directory removed and made again
// (nothing of the old one stays), a symlink (written, never followed).
// --workdir-live binds DIR live instead: the same writes are not capped
// and no write-back is reported.
func TestWorkdirCapped(t *testing.T) {
	needRoot(t)
	inner := privateChain(t)
	wd := filepath.Join(inner, "wd")
	const owner, group = 4242, 4343
	files := map[string]string{"keep.txt": "old\n", "del.txt": "gone\n", "sub/x.txt": "x\n"}
	for p, c := range files {
		full := filepath.Join(wd, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"", "keep.txt", "del.txt", "sub", "sub/x.txt"} {
		if err := os.Chown(filepath.Join(wd, p), owner, group); err != nil {
			t.Fatal(err)
		}
	}
	script := `n=0; while dd if=/dev/zero of=big$n bs=1M count=60 2>/dev/null; do n=$((n+1)); [ $n -lt 8 ] || break; done
echo "whole=$n"; rm -f big*
echo new > new.txt; echo more >> keep.txt; rm del.txt; rm -r sub; mkdir sub; echo z > sub/z.txt
ln -s /etc/shadow link; echo done`
	r := sh(t, "restrictive", script, "--workdir", wd)
	if !strings.Contains(r.Stdout, "whole=4\n") || !strings.HasSuffix(r.Stdout, "done\n") {
		t.Fatalf("stdout %q: want 4 whole 60 MiB files under the 256 MiB cap, then the rest of the script", r.Stdout)
	}
	wb := r.Res.WriteBack
	if wb == nil || wb.Error != nil || wb.Dir != wd || wb.Removed != 1 || wb.Files != 3 || wb.Symlinks != 1 {
		t.Fatalf("write_back %+v (error %v): want new.txt, keep.txt, sub/z.txt, link and the removal of del.txt", wb, errOf(wb))
	}
	want := map[string]string{"new.txt": "new\n", "keep.txt": "old\nmore\n", "sub/z.txt": "z\n"}
	for p, c := range want {
		got, err := os.ReadFile(filepath.Join(wd, p))
		if err != nil || string(got) != c {
			t.Errorf("%s on the host: %q %v, want %q", p, got, err, c)
		}
		if u := hostUID(t, filepath.Join(wd, p)); u != owner {
			t.Errorf("%s on the host: uid %d, want the work dir's owner %d", p, u, owner)
		}
	}
	for _, p := range []string{"del.txt", "sub/x.txt", "big0"} {
		if _, err := os.Lstat(filepath.Join(wd, p)); !os.IsNotExist(err) {
			t.Errorf("%s should be gone from the host: %v", p, err)
		}
	}
	if target, err := os.Readlink(filepath.Join(wd, "link")); err != nil || target != "/etc/shadow" {
		t.Errorf("link on the host: %q %v", target, err)
	}

	// Live: no cap (five 60 MiB files), no write-back.
	live := sh(t, "restrictive", `n=0; while [ $n -lt 5 ] && dd if=/dev/zero of=big$n bs=1M count=60 2>/dev/null; do n=$((n+1)); done; echo "whole=$n"; rm -f big*`,
		"--workdir", wd, "--workdir-live")
	if live.Stdout != "whole=5\n" || live.Res.WriteBack != nil {
		t.Fatalf("--workdir-live: stdout %q, write_back %+v: want 5 whole files and no write-back", live.Stdout, live.Res.WriteBack)
	}
}

func errOf(wb *writeback.Report) error {
	if wb == nil || wb.Error == nil {
		return nil
	}
	return wb.Error
}
