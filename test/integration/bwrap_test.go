package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// bwrapRunner is the tool the worker line runs (python -m MODULE ARGS):
// it reports what a tool sees, reads its input, writes its result into
// the work dir and exits with the status its arguments name.
const bwrapRunner = `import json, os, sys, socket
args = json.load(open(sys.argv[1]))
env = {k: v for k, v in os.environ.items()
       if k != "STR_NETWORK" and not k.lower().endswith("_proxy")}
try:
    open("/usr/str-bwrap-probe", "w")
    usr_writable = True
except OSError:
    usr_writable = False
try:
    open("/var/str-bwrap-probe", "w")
    var_writable = True
except OSError:
    var_writable = False
seen = {
    "uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(),
    "cwd": os.getcwd(), "env": env,
    "input": open("input/in.txt").read(),
    "usr_writable": usr_writable, "var_writable": var_writable,
    "tmp_empty": os.listdir("/tmp") == [],
    "dev": sorted(os.listdir("/dev")),
    "hostname": socket.gethostname(),
    "pid1_is_sandbox": open("/proc/1/cmdline", "rb").read() != b"",
    "str_network": os.environ.get("STR_NETWORK", ""),
    "https_proxy": os.environ.get("HTTPS_PROXY", ""),
}
with open("output/result.json", "w") as f:
    json.dump({"ok": True, "echo": args["echo"]}, f)
print(json.dumps(seen, sort_keys=True))
sys.exit(args["exit"])
`

// bwrapFixture lays out the reference runtime's sandbox: a tools dir on
// PYTHONPATH and a task work dir with input/, output/ and the runner's
// arguments, owned by an unprivileged user (str binds a writable dir
// id-mapped to its owner; a root-owned one would not be the tool's).
// It lives under parent, outside what the worker lines mount a tmpfs over.
func bwrapFixture(t *testing.T, parent string) (tools, work string) {
	t.Helper()
	base, err := os.MkdirTemp(parent, "str-bwrap-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	tools = filepath.Join(base, "tools")
	work = filepath.Join(base, "work", "task-1")
	for _, d := range []string{tools, filepath.Join(work, "input"), filepath.Join(work, "output")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		filepath.Join(tools, "str_bwrap_runner.py"): bwrapRunner,
		filepath.Join(work, "input", "in.txt"):      "the caller's input\n",
		filepath.Join(work, "runner_args.json"):     `{"echo": "hello", "exit": 3}`,
	}
	for p, s := range files {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := filepath.Walk(work, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 1000, 1000)
	}); err != nil {
		t.Fatal(err)
	}
	return tools, work
}

// workerLine is the argument list the reference runtime's Python worker
// builds for bubblewrap (solace-agent-mesh, branch ed/tools-in-container,
// sandbox_runner.py _build_bwrap_command) under each of its profiles:
// restrictive adds --unshare-net; standard and permissive forward
// PYTHONDONTWRITEBYTECODE and PYTHONUNBUFFERED from the worker's
// environment (keep_env; set to 1 here); permissive adds --tmpfs /var
// (writable_var). The interpreter is python3 here.
func workerLine(work, tools, profile string) []string {
	line := []string{"--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts"}
	if profile == "restrictive" {
		line = append(line, "--unshare-net")
	}
	line = append(line, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
		"--bind", work, work)
	if profile == "permissive" {
		line = append(line, "--tmpfs", "/var")
	}
	line = append(line, "--chdir", work, "--clearenv",
		"--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
		"--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONPATH", tools, "--setenv", "_SAM_SANDBOX_LIGHT", "1")
	if profile != "restrictive" {
		line = append(line, "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "PYTHONUNBUFFERED", "1")
	}
	return append(line, "--", "/usr/bin/python3", "-m", "str_bwrap_runner", filepath.Join(work, "runner_args.json"))
}

type bwrapRun struct {
	stdout, stderr string
	exit           int
	result         string // output/result.json
}

// runBwrap runs prog with args from the work dir, with the worker's
// minimal environment (PATH only).
func runBwrap(t *testing.T, work string, prog string, args ...string) bwrapRun {
	t.Helper()
	os.Remove(filepath.Join(work, "output", "result.json"))
	cmd := exec.Command(prog, args...)
	cmd.Dir = work
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", prog, err)
	}
	waitStarted(t, cmd, prog, &errb)
	res, _ := os.ReadFile(filepath.Join(work, "output", "result.json"))
	return bwrapRun{stdout: out.String(), stderr: errb.String(), exit: cmd.ProcessState.ExitCode(), result: string(res)}
}

func seenOf(t *testing.T, who string, r bwrapRun) map[string]any {
	t.Helper()
	var seen map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &seen); err != nil {
		t.Fatalf("%s: stdout is not the runner's report (%v)\nstdout: %s\nstderr: %s", who, err, r.stdout, r.stderr)
	}
	return seen
}

// The worker's exact lines run unchanged under `str bwrap` and under str
// invoked as bwrap, and give what the tool is promised: uid 0 as the
// caller (root), the work dir as cwd, exactly the environment set, its
// input, its result written, a read-only root, an empty /tmp, exit 3.
// With the machine's bubblewrap present, its run of the same lines must
// show the same.
func TestBwrapWorkerLines(t *testing.T) {
	needRoot(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		mustwork.Skip(t, "needs /usr/bin/python3 (the worker line runs a Python tool)")
	}
	// Under /srv, not /var/tmp: the permissive line mounts a tmpfs over
	// /var (and one over /tmp).
	if err := os.MkdirAll("/srv", 0o755); err != nil {
		t.Fatal(err)
	}
	tools, work := bwrapFixture(t, "/srv")
	link := filepath.Join(t.TempDir(), "bwrap")
	if err := os.Symlink(strBin, link); err != nil {
		t.Fatal(err)
	}
	realBwrap := ""
	if _, err := os.Stat("/usr/bin/bwrap"); err == nil {
		realBwrap = "/usr/bin/bwrap"
	} else {
		t.Log("no /usr/bin/bwrap: str's runs are checked on their own (apt-get install bubblewrap for the side-by-side comparison)")
	}
	hostname, _ := os.Hostname()
	for _, name := range []string{"standard", "restrictive", "permissive"} {
		line := workerLine(work, tools, name)
		restrictive := name == "restrictive"
		t.Run(name, func(t *testing.T) {
			runs := map[string]bwrapRun{
				"str bwrap":    runBwrap(t, work, strBin, append([]string{"bwrap"}, line...)...),
				"str as bwrap": runBwrap(t, work, link, line...),
			}
			if realBwrap != "" {
				runs["bubblewrap"] = runBwrap(t, work, realBwrap, line...)
			}
			env := map[string]any{"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
				"PYTHONPATH": tools, "_SAM_SANDBOX_LIGHT": "1", "PWD": work}
			if !restrictive {
				env["PYTHONDONTWRITEBYTECODE"], env["PYTHONUNBUFFERED"] = "1", "1"
			}
			want := map[string]any{
				"uid": 0.0, "gid": 0.0, "euid": 0.0, "cwd": work,
				"env":   env,
				"input": "the caller's input\n", "usr_writable": false, "var_writable": name == "permissive", "tmp_empty": true,
				"dev":      []any{"core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"},
				"hostname": hostname, "pid1_is_sandbox": true,
			}
			// Without --unshare-net str puts the tool on the caller's
			// network, as bubblewrap (str profile standard allows it:
			// share_caller_network), and adds no proxy variables.
			want["str_network"], want["https_proxy"] = "", ""
			for who, r := range runs {
				if r.exit != 3 {
					t.Errorf("%s: exit %d, want the tool's 3\nstderr: %s", who, r.exit, r.stderr)
					continue
				}
				seen := seenOf(t, who, r)
				if !reflect.DeepEqual(seen, want) {
					t.Errorf("%s: the tool saw\n %v\nwant\n %v", who, seen, want)
				}
				if r.result != `{"ok": true, "echo": "hello"}` {
					t.Errorf("%s: result.json %q", who, r.result)
				}
			}
		})
	}
}

// --json-status-fd: the child's pid and namespaces once it runs, then
// its exit code; --info-fd: the same document, pretty.
func TestBwrapStatusFDs(t *testing.T) {
	needRoot(t)
	statusR, statusW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	infoR, infoW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(strBin, "bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--info-fd", "3", "--json-status-fd", "4", "--", "/bin/sh", "-c", "exit 7")
	cmd.ExtraFiles = []*os.File{infoW, statusW}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	statusW.Close()
	infoW.Close()
	waitStarted(t, cmd, "str bwrap", &errb)
	if code := cmd.ProcessState.ExitCode(); code != 7 {
		t.Fatalf("exit %d, want 7; stderr: %s", code, errb.String())
	}
	status, _ := readAllClose(statusR)
	info, _ := readAllClose(infoR)
	lines := strings.Split(strings.TrimSpace(status), "\n")
	if len(lines) != 2 {
		t.Fatalf("json-status-fd: %q, want two documents", status)
	}
	var start map[string]int64
	var end map[string]int
	if err := json.Unmarshal([]byte(lines[0]), &start); err != nil || start["child-pid"] <= 0 || start["pid-namespace"] == 0 || start["mnt-namespace"] == 0 {
		t.Errorf("first document %q (%v): want child-pid and namespaces", lines[0], err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &end); err != nil || end["exit-code"] != 7 {
		t.Errorf("last document %q (%v): want exit-code 7", lines[1], err)
	}
	var infoDoc map[string]int64
	if err := json.Unmarshal([]byte(info), &infoDoc); err != nil || infoDoc["child-pid"] != start["child-pid"] {
		t.Errorf("info-fd %q (%v): want the same child-pid as the status", info, err)
	}
}

func readAllClose(f *os.File) (string, error) {
	defer f.Close()
	var b bytes.Buffer
	_, err := b.ReadFrom(f)
	return b.String(), err
}

// Bad lines fail as bubblewrap's do, exit 1, naming the option: unknown,
// short of an argument, or one str refuses (with the reason).
func TestBwrapRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--frobnicate", "true"}, "Unknown option --frobnicate"},
		{[]string{"--bind", "/usr"}, "--bind takes two arguments"},
		{[]string{"--userns2", "0", "true"}, "--userns2: not supported by str bwrap: str's init joins no second user namespace"},
		{[]string{"--pidns", "0", "true"}, "--pidns: not supported by str bwrap: it needs --userns"},
		{[]string{"--userns", "0", "--unshare-user", "true"}, "--userns not compatible --unshare-user"},
		{[]string{"--overlay-src", "/usr", "true"}, "--overlay-src must be followed by another --overlay-src or one of --overlay, --tmp-overlay, or --ro-overlay"},
		{[]string{"--level-prefix", "--exec-label", "x", "true"}, "<3>str bwrap: --exec-label: not supported by str bwrap"},
	} {
		cmd := exec.Command(strBin, append([]string{"bwrap"}, tc.args...)...)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), tc.want) {
			t.Errorf("str bwrap %q: exit %d, output %q; want 1 and %q", tc.args, cmd.ProcessState.ExitCode(), out, tc.want)
		}
	}
}

// --die-with-parent: when the process that started str bwrap dies, str
// bwrap dies, and its sandbox with it.
func TestBwrapDieWithParent(t *testing.T) {
	needRoot(t)
	marker := fmt.Sprintf("4321.%d", os.Getpid())
	parent := exec.Command("/bin/sh", "-c", `"$0" bwrap --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 -- sleep "$1" & wait`, strBin, marker)
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	// The sandboxed sleep itself (its argv is [/usr/bin/]sleep MARKER),
	// not str bwrap's own command line, which ends with the same words:
	// only once the sandbox runs is the parent-death signal surely armed.
	sandboxed := func() bool {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			argv := strings.Split(strings.TrimSuffix(string(cl), "\x00"), "\x00")
			if err == nil && len(argv) == 2 && filepath.Base(argv[0]) == "sleep" && argv[1] == marker {
				return true
			}
		}
		return false
	}
	if !eventually(60*time.Second, sandboxed) {
		_ = parent.Process.Kill()
		_ = parent.Wait()
		t.Fatal("the sandboxed sleep never started")
	}
	_ = parent.Process.Kill()
	_ = parent.Wait()
	if !eventually(60*time.Second, func() bool { return len(findProcs(marker)) == 0 }) {
		t.Fatalf("str bwrap or its sandbox outlived the parent: pids %v", findProcs(marker))
	}
}

// --plan prints the sandbox (the line's filesystem in order, the
// profile's namespaces) and runs nothing; --help and --version answer as
// bubblewrap's do; no command is a usage error.
func TestBwrapPlanHelpVersion(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		exit   int
		prefix string
	}{
		{[]string{"--help"}, 0, "usage: str bwrap "},
		{[]string{"--version"}, 0, "bubblewrap 0.11.1 (str "},
		{[]string{"--unshare-pid"}, 1, "usage: str bwrap "},
	} {
		cmd := exec.Command(strBin, append([]string{"bwrap"}, tc.args...)...)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != tc.exit || !strings.HasPrefix(string(out), tc.prefix) {
			t.Errorf("str bwrap %q: exit %d, output %q; want %d and %q...", tc.args, cmd.ProcessState.ExitCode(), out, tc.exit, tc.prefix)
		}
	}
	// Called as bwrap, the usage names the program as called (argv[0]),
	// as bubblewrap's does; its errors start with "bwrap: ".
	link := filepath.Join(t.TempDir(), "bwrap")
	if err := os.Symlink(strBin, link); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command(link, "--help").CombinedOutput(); !strings.HasPrefix(string(out), "usage: "+link+" ") {
		t.Errorf("%s --help: %q; want it to start with %q", link, out, "usage: "+link+" ")
	}
	if out, _ := exec.Command(link, "--bind", "/nonexistent-bwrap-src", "/x", "true").CombinedOutput(); !strings.HasPrefix(string(out), "bwrap: Can't find source path /nonexistent-bwrap-src: ") {
		t.Errorf("missing bind source: %q; want bubblewrap's \"bwrap: Can't find source path ...\"", out)
	}
	// Two --chdir: bubblewrap's warning, and the line still runs (the
	// suite's "warning logged for redundant --chdir", bubblewrap >= 0.10).
	if out, err := exec.Command(link, "--ro-bind", "/", "/", "--chdir", "/", "--chdir", "/", "true").CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "bwrap: Only the last --chdir option will take effect\n") {
		t.Errorf("two --chdir: %v, %q; want bubblewrap's warning and exit 0", err, out)
	}
	needRoot(t)
	marker := filepath.Join(t.TempDir(), "ran")
	out, err := exec.Command(strBin, "bwrap", "--plan", "--str-profile", "restrictive", "--unshare-net", "--ro-bind", "/usr", "/usr",
		"--tmpfs", "/tmp", "--", "/usr/bin/touch", marker).CombinedOutput()
	if err != nil {
		t.Fatalf("--plan: %v\n%s", err, out)
	}
	for _, want := range []string{"profile: restrictive", "1. bind ro /usr -> /usr", "2. tmpfs /tmp (mode=0755,uid=0,gid=0)", "network: policy isolated", "CLONE_NEWNET"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--plan output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("--plan ran the command")
	}
	// Without --unshare-net: the caller's network under standard (it
	// allows share_caller_network), the proxy under restrictive, which
	// forbids it, each said with its reason; the environment gets the
	// proxy's variables only then (--clearenv leaves PWD alone otherwise).
	for _, c := range []struct {
		profile string
		want    []string
		not     []string
	}{
		{"standard", []string{"network: the caller's (the line does not unshare it", "network: the caller's own (no network namespace", `environment: ["PWD=/"]`},
			[]string{"CLONE_NEWNET", "HTTP_PROXY"}},
		{"restrictive", []string{"profile restrictive does not allow share_caller_network", "CLONE_NEWNET", "STR_NETWORK=isolated"}, nil},
	} {
		out, err := exec.Command(strBin, "bwrap", "--plan", "--str-profile", c.profile, "--clearenv", "--ro-bind", "/usr", "/usr", "--chdir", "/", "--", "/usr/bin/true").CombinedOutput()
		if err != nil {
			t.Fatalf("--plan %s: %v\n%s", c.profile, err, out)
		}
		for _, w := range c.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("--plan --str-profile %s lacks %q:\n%s", c.profile, w, out)
			}
		}
		for _, w := range c.not {
			if strings.Contains(string(out), w) {
				t.Errorf("--plan --str-profile %s has %q:\n%s", c.profile, w, out)
			}
		}
	}
}

// A bubblewrap line that binds a secrets directory (Kubernetes' token,
// Docker's secrets) does not show it under str: str's promise is kept.
func TestBwrapHidesSecrets(t *testing.T) {
	needRoot(t)
	fake := t.TempDir()
	if err := os.MkdirAll(filepath.Join(fake, "secrets"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fake, "secrets", "token"), []byte("TOKEN"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(strBin, "bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--ro-bind", fake, "/run", "--", "/bin/sh", "-c", "ls -A /run/secrets; cat /run/secrets/token")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || strings.Contains(string(out), "TOKEN") || !strings.Contains(string(out), "No such file") {
		t.Errorf("exit %d, output %q: want the token absent (cat fails, exit 1)", cmd.ProcessState.ExitCode(), out)
	}
}

// --disable-userns: honoured through the profile's seccomp policy, the
// command cannot make a user namespace.
func TestBwrapDisableUserns(t *testing.T) {
	needRoot(t)
	if _, err := os.Stat("/usr/bin/unshare"); err != nil {
		mustwork.Skip(t, "needs /usr/bin/unshare (util-linux)")
	}
	cmd := exec.Command(strBin, "bwrap", "--unshare-user", "--disable-userns", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
		"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--", "/usr/bin/unshare", "-U", "true")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() == 0 || !strings.Contains(string(out), "Operation not permitted") {
		t.Errorf("unshare -U under --disable-userns: exit %d, %q; want EPERM", cmd.ProcessState.ExitCode(), out)
	}
}

// Rootless: an unprivileged caller's line (a delegated cgroup of its
// own, as TestRootless) sees its own uid inside, as under bubblewrap,
// where a user namespace is implied for a non-root caller; with the
// machine's bubblewrap the same line shows the same.
func TestBwrapRootless(t *testing.T) {
	line := `--unshare-pid --unshare-net --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 ` +
		`--proc /proc --dev /dev --tmpfs /tmp --chdir /tmp --clearenv --setenv PATH /usr/bin -- /bin/sh -c 'id -u; id -g; pwd; echo x > f && cat f; env'`
	for who, r := range rootlessBwrap(t, line) {
		if r.err != nil {
			t.Errorf("%s rootless: %v\n%s", who, r.err, r.out)
			continue
		}
		if got, want := strings.Fields(r.out), []string{"1000", "1000", "/tmp", "x", "PATH=/usr/bin", "PWD=/tmp"}; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s rootless:\ngot  %q\nwant %q", who, got, want)
		}
	}
}

type rootlessRun struct {
	out string
	err error
}

// rootlessBwrap runs line (shell words) as uid 1000 under str bwrap, in a
// cgroup v1 subtree delegated to that uid (created here), and under the
// machine's bubblewrap when it has one, from /: their output by who ran.
func rootlessBwrap(t *testing.T, line string) map[string]rootlessRun {
	t.Helper()
	needRoot(t) // to set up the unprivileged user's delegated cgroup
	if _, err := exec.LookPath("setpriv"); err != nil {
		mustwork.Skip(t, "needs setpriv (util-linux) to drop to an unprivileged uid")
	}
	dir := t.TempDir()
	_ = os.Chmod(dir, 0o755)
	bin := strCopyIn(t, dir)
	const uid = 1000
	moves := delegatedCgroupMoves(t, uid)
	if len(moves) == 0 {
		mustwork.Skip(t, "no cgroup v1 controllers on this host (a v2 host runs the rootless tests in the VM)")
	}
	progs := map[string]string{"str bwrap": bin + " bwrap"}
	if _, err := os.Stat("/usr/bin/bwrap"); err == nil {
		progs["bubblewrap"] = "/usr/bin/bwrap"
	}
	out := map[string]rootlessRun{}
	for who, prog := range progs {
		script := strings.Join(moves, " && ") + fmt.Sprintf(" && cd / && exec setpriv --reuid %d --regid %d --clear-groups %s %s", uid, uid, prog, line)
		b, err := exec.Command("/bin/sh", "-c", script).CombinedOutput()
		out[who] = rootlessRun{string(b), err}
	}
	return out
}

// The filesystem options the init gained for str bwrap (--remount-ro,
// --mqueue, --chmod, --perms on --dir, --file, --bind-data, --ro-bind-data,
// Debian's --ro-bind-fd, a destination through the line's own symlink) give the tool what the
// machine's bubblewrap gives it on the same line: the same modes, the
// same read-only mounts, the same data.
func TestBwrapFilesystemOptionsSideBySide(t *testing.T) {
	needRoot(t)
	bubblewrap := "/usr/bin/bwrap"
	if _, err := os.Stat(bubblewrap); err != nil {
		mustwork.Skip(t, "needs the machine's bubblewrap (apt-get install bubblewrap) to compare with")
	}
	// Owned by an unprivileged user: str binds a writable dir id-mapped
	// to its owner (a root-owned one would not be the tool's). Under
	// /var/tmp: the line mounts a tmpfs over /tmp.
	src, err := os.MkdirTemp("/var/tmp", "str-bwrap-fs-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(src)
	if err := os.Chown(src, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Others may list it: --ro-bind-fd binds it read-only, which str
	// does not id-map (the tool, a leased uid, is "others" there).
	if err := os.Chmod(src, 0o755); err != nil {
		t.Fatal(err)
	}
	script := `cd /tmp; stat -c '%a %n' s c p p/d f b r; ls link/; stat -f -c %T mq
touch m/x 2>/dev/null && echo m writable || echo m read-only
touch m/sub/x && echo m/sub writable || echo m/sub read-only
(echo more >> r) 2>/dev/null && echo r writable || echo r read-only
cat f b r; ls byfd`
	// The usr-merged system, not all of / (a bind of the host's whole
	// root carries whatever other tests left mounted under /tmp).
	line := []string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--tmpfs", "/tmp",
		"--bind", src, "/tmp/m", "--tmpfs", "/tmp/m/sub", "--remount-ro", "/tmp/m",
		"--perms", "01777", "--dir", "/tmp/s", "--dir", "/tmp/c", "--chmod", "0700", "/tmp/c",
		"--perms", "0640", "--dir", "/tmp/p/d",
		"--dir", "/tmp/real", "--symlink", "real", "/tmp/link", "--dir", "/tmp/link/inside",
		"--mqueue", "/tmp/mq", "--file", "3", "/tmp/f", "--perms", "0640", "--bind-data", "4", "/tmp/b", "--ro-bind-data", "5", "/tmp/r",
		"--ro-bind-fd", "6", "/tmp/byfd",
		"sh", "-c", script}
	run := func(prog string, args ...string) string {
		var files []*os.File
		for _, data := range []string{"file\n", "bind-data\n", "ro-bind-data\n"} {
			p := filepath.Join(t.TempDir(), "data")
			if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			files = append(files, f)
		}
		d, err := os.Open(src) // --ro-bind-fd's descriptor: the directory
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		files = append(files, d)
		cmd := exec.Command(prog, args...)
		cmd.ExtraFiles = files
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", prog, err, out.String(), errb.String())
		}
		return out.String()
	}
	want := run(bubblewrap, line...)
	got := run(strBin, append([]string{"bwrap"}, line...)...)
	if got != want {
		t.Fatalf("str bwrap shows\n%s\nbubblewrap shows\n%s", got, want)
	}
	for _, s := range []string{"1777 s", "700 c", "750 p", "640 p/d", "666 f", "640 b", "600 r", "inside", "m read-only", "m/sub writable", "r read-only", "mqueue", "file\nbind-data\nro-bind-data\nmarker\n"} {
		if !strings.Contains(got, s) {
			t.Errorf("both show\n%s\nwithout %q", got, s)
		}
	}
}

// --argv0 is the command's argv[0]; the program run is still the one
// named (bubblewrap 0.9's option: Debian 12's 0.8 has none to compare).
func TestBwrapArgv0(t *testing.T) {
	needRoot(t)
	out, err := exec.Command(strBin, "bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--argv0", "my-name", "sh", "-c", `echo "$0"`).CombinedOutput()
	if err != nil || string(out) != "my-name\n" {
		t.Fatalf("str bwrap --argv0 my-name sh -c 'echo $0': %v, %q; want my-name", err, out)
	}
}

// --add-seccomp-fd and --seccomp: the caller's own filter (here: mkdir
// and mkdirat fail with EPERM) applies in the sandbox as it does under
// the machine's bubblewrap, instead of str's profile filter (caller_seccomp: replace).
func TestBwrapCallerSeccomp(t *testing.T) {
	needRoot(t)
	if runtime.GOARCH != "amd64" {
		mustwork.Skip(t, "the test's BPF program is written for x86_64 (AUDIT_ARCH_X86_64, its syscall numbers)")
	}
	bubblewrap := "/usr/bin/bwrap"
	if _, err := os.Stat(bubblewrap); err != nil {
		mustwork.Skip(t, "needs the machine's bubblewrap (apt-get install bubblewrap) to compare with")
	}
	const (
		ldW, jeqK, ret = 0x20, 0x15, 0x06 // BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
		archX8664      = 0xc000003e
		sysMkdir       = 83
		sysMkdirat     = 258
		retErrnoEPERM  = 0x00050000 | 1
		retAllow       = 0x7fff0000
	)
	insns := [][4]uint32{
		{ldW, 0, 0, 4},             // 0: arch
		{jeqK, 0, 4, archX8664},    // 1: another arch: allow (6)
		{ldW, 0, 0, 0},             // 2: nr
		{jeqK, 1, 0, sysMkdir},     // 3: mkdir: EPERM (5)
		{jeqK, 0, 1, sysMkdirat},   // 4: mkdirat: EPERM (5), else allow (6)
		{ret, 0, 0, retErrnoEPERM}, // 5
		{ret, 0, 0, retAllow},      // 6
	}
	var prog []byte
	for _, in := range insns {
		prog = append(prog, byte(in[0]), byte(in[0]>>8), byte(in[1]), byte(in[2]),
			byte(in[3]), byte(in[3]>>8), byte(in[3]>>16), byte(in[3]>>24))
	}
	progFile := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(progFile, prog, 0o600); err != nil {
		t.Fatal(err)
	}
	script := `mkdir /tmp/made && echo mkdir allowed || echo mkdir refused; touch /tmp/file && echo touch allowed`
	for _, opt := range []string{"--seccomp", "--add-seccomp-fd"} {
		line := []string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
			"--symlink", "usr/lib64", "/lib64", "--tmpfs", "/tmp", opt, "3", "sh", "-c", script}
		run := func(prog string, args ...string) string {
			f, err := os.Open(progFile)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd := exec.Command(prog, args...)
			cmd.ExtraFiles = []*os.File{f}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", prog, opt, err, out)
			}
			return string(out)
		}
		want := run(bubblewrap, line...)
		got := run(strBin, append([]string{"bwrap"}, line...)...)
		// mkdir's own message names the errno: both must show EPERM.
		if got != want || !strings.Contains(want, "Operation not permitted") || !strings.HasSuffix(want, "mkdir refused\ntouch allowed\n") {
			t.Errorf("%s: str bwrap shows %q, bubblewrap %q; want both to refuse mkdir with EPERM and allow touch", opt, got, want)
		}
	}
}

// A command that cannot be executed has no exit code in --json-status-fd
// (bubblewrap reports one only for a command that ran); str bwrap fails
// with bubblewrap's status 1.
func TestBwrapStatusFDExecFailure(t *testing.T) {
	needRoot(t)
	statusR, statusW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(strBin, "bwrap", "--ro-bind", "/usr", "/usr", "--json-status-fd", "3", "--", "/")
	cmd.ExtraFiles = []*os.File{statusW}
	out, _ := cmd.CombinedOutput()
	statusW.Close()
	status, _ := readAllClose(statusR)
	// The sandbox started (its child-pid is reported), its command did not.
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(status, `"child-pid"`) || strings.Contains(status, "exit-code") {
		t.Fatalf("exec of /: exit %d, json-status %q, output %q; want 1, a child-pid and no exit-code", cmd.ProcessState.ExitCode(), status, out)
	}
}

// --lock-file: while the sandbox runs, the host file its bind shows
// carries a read lock held by str bwrap (bubblewrap's pid 1 holds it
// inside); once str bwrap is gone, the lock is gone with it.
func TestBwrapLockFile(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	lock := filepath.Join(dir, "lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(strBin, "bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--ro-bind", dir, "/d", "--lock-file", "/d/lock", "--", "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	holder := func() int32 {
		f, err := os.Open(lock)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		lk := unix.Flock_t{Type: unix.F_WRLCK}
		if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk); err != nil {
			t.Fatal(err)
		}
		if lk.Type == unix.F_UNLCK {
			return 0
		}
		return lk.Pid
	}
	deadline := time.Now().Add(60 * time.Second)
	for holder() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no lock on the host file within 60 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pid := holder(); int(pid) != cmd.Process.Pid {
		t.Fatalf("the lock is held by pid %d, want str bwrap's %d", pid, cmd.Process.Pid)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if pid := holder(); pid != 0 {
		t.Fatalf("lock still held by pid %d after str bwrap exited", pid)
	}
}

// --block-fd N: the command does not start until N has data (or is
// closed), under bubblewrap and str bwrap alike. Deterministic: once
// --info-fd says the sandbox exists, the command's marker is checked
// absent (it cannot run before the write, however slow the machine),
// then one byte is written and the marker must appear with exit 0.
// str builds the sandbox up to its init's step 10a meanwhile.
func TestBwrapBlockFD(t *testing.T) {
	needRoot(t)
	bw, err := exec.LookPath("bwrap")
	if err != nil {
		t.Skip("no bwrap on this machine to compare with")
	}
	for _, bin := range []struct{ who, path string }{{"bwrap", bw}, {"str bwrap", strBin}} {
		t.Run(bin.who, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			blockR, blockW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			infoR, infoW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			args := []string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
				"--symlink", "usr/lib64", "/lib64", "--bind", dir, "/d", "--unshare-pid", "--block-fd", "3", "--info-fd", "4",
				"--", "/bin/sh", "-c", "echo ran > /d/marker"}
			var cmd *exec.Cmd
			if bin.who == "str bwrap" {
				cmd = exec.Command(bin.path, append([]string{"bwrap"}, args...)...)
			} else {
				cmd = exec.Command(bin.path, args...)
			}
			cmd.ExtraFiles = []*os.File{blockR, infoW}
			var errb bytes.Buffer
			cmd.Stderr = &errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			blockR.Close()
			infoW.Close()
			info, err := readAllClose(infoR) // EOF once the sandbox exists (info written and closed)
			if err != nil || !strings.Contains(info, "child-pid") {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("--info-fd: %q %v; stderr %s", info, err, errb.String())
			}
			if _, err := os.Stat(filepath.Join(dir, "marker")); !os.IsNotExist(err) {
				t.Errorf("the command ran before --block-fd had data: %v", err)
			}
			if _, err := blockW.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			blockW.Close()
			if err := cmd.Wait(); err != nil {
				t.Fatalf("exit: %v; stderr %s", err, errb.String())
			}
			if got, err := os.ReadFile(filepath.Join(dir, "marker")); err != nil || string(got) != "ran\n" {
				t.Fatalf("marker after the write: %q %v", got, err)
			}
		})
	}
}

// Two more users' kinds of line run unchanged with the same visible
// result under bubblewrap and str bwrap (issue 22's done-when): a coding
// agent's (the host's root read-only, the project dir writable, its own
// /tmp, /dev and /proc, no network, a new session, die with the parent)
// and a desktop app's (only /usr with the usual symlinks, every namespace,
// its own hostname, a runtime dir made and named in the environment, the
// passwd file read-only, data written from a descriptor). The probe prints
// what the command sees, the owner and writability of the root and of the
// runtime dir among it; the comparison is exact.
func TestBwrapAgentAndDesktopLines(t *testing.T) {
	needRoot(t)
	bw, err := exec.LookPath("bwrap")
	if err != nil {
		t.Skip("no bwrap on this machine to compare with")
	}
	probe := `id -u; id -g; pwd; hostname; echo "xdg=$XDG_RUNTIME_DIR"; ls -1 / | tr '\n' ' '; echo
if touch /usr/x 2>/dev/null; then echo usr-writable; else echo usr-read-only; fi
if [ -d /run/user/1000 ] && [ -w /run/user/1000 ]; then echo runtime-dir; fi
stat -c '%n %u %g %a' / /run/user/1000 /tmp; if touch /at-root 2>/dev/null; then echo root-writable; fi
ls -A /tmp | wc -l; cat /etc/app.conf 2>/dev/null; echo written > out.txt && echo wrote`
	for _, kind := range []string{"agent", "desktop"} {
		t.Run(kind, func(t *testing.T) {
			// Not under /tmp (the agent's line puts a tmpfs there), and
			// owned by a user, as a project is: as root, str bwrap binds a
			// writable source id-mapped to its owner (a root-owned one is
			// writable only where its mode lets others: docs/bwrap.md).
			if err := os.MkdirAll("/srv", 0o755); err != nil {
				t.Fatal(err)
			}
			project, err := os.MkdirTemp("/srv", "str-bwrap-project-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(project) })
			// 0777: bubblewrap's --unshare-all maps only root, to whom a
			// 4242-owned 0755 dir is not writable.
			if err := os.Chmod(project, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(project, 4242, 4242); err != nil {
				t.Fatal(err)
			}
			var line []string
			switch kind {
			case "agent":
				line = []string{"--new-session", "--die-with-parent", "--ro-bind", "/", "/", "--bind", project, project,
					"--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-net", "--chdir", project,
					"--", "/bin/sh", "-c", probe}
			case "desktop":
				line = []string{"--unshare-all", "--uid", "1000", "--gid", "1000", "--die-with-parent", "--new-session", "--hostname", "app",
					"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
					"--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin", "--proc", "/proc", "--dev", "/dev",
					"--tmpfs", "/tmp", "--dir", "/run/user/1000", "--setenv", "XDG_RUNTIME_DIR", "/run/user/1000",
					"--ro-bind", "/etc/passwd", "/etc/passwd", "--ro-bind-data", "3", "/etc/app.conf",
					"--bind", project, "/home/app", "--chdir", "/home/app", "--", "/bin/sh", "-c", probe}
			}
			runs := map[string]string{}
			for _, who := range []struct{ name, prog string }{{"bubblewrap", bw}, {"str bwrap", strBin}} {
				args := line
				if who.name == "str bwrap" {
					args = append([]string{"bwrap"}, line...)
				}
				cmd := exec.Command(who.prog, args...)
				cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/root"}
				if kind == "desktop" {
					r, w, err := os.Pipe()
					if err != nil {
						t.Fatal(err)
					}
					if _, err := w.WriteString("theme=dark\n"); err != nil {
						t.Fatal(err)
					}
					w.Close()
					cmd.ExtraFiles = []*os.File{r}
					defer r.Close()
				}
				os.Remove(filepath.Join(project, "out.txt"))
				out, err := cmd.Output()
				if err != nil {
					var stderr string
					if ee, ok := err.(*exec.ExitError); ok {
						stderr = string(ee.Stderr)
					}
					t.Fatalf("%s: %v\n%s%s", who.name, err, out, stderr)
				}
				if got, err := os.ReadFile(filepath.Join(project, "out.txt")); err != nil || string(got) != "written\n" {
					t.Errorf("%s: the command's file on the host: %q %v", who.name, got, err)
				}
				runs[who.name] = string(out)
			}
			if runs["bubblewrap"] != runs["str bwrap"] {
				t.Errorf("the command saw different things:\nbubblewrap:\n%s\nstr bwrap:\n%s", runs["bubblewrap"], runs["str bwrap"])
			}
		})
	}
}
