package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// clientProbe is what each client line runs: what the command sees
// (identity, cwd, /, its environment), which paths it may write, a
// write into its bound work dir, whether it reaches a loopback service
// of the caller's (the test's listener, port $1), and its exit status.
const clientProbe = `id -u; id -g; pwd; ls -1 / | tr '\n' ' '; echo
env | sort | grep -v -e '^_=' -e '^SHLVL=' -e '^OLDPWD='
if touch /usr/str-client-probe 2>/dev/null; then echo usr-writable; else echo usr-read-only; fi
if touch .git/hooks/probe 2>/dev/null; then echo hooks-writable; else echo hooks-read-only; fi
if touch .bashrc 2>/dev/null; then echo bashrc-writable; else echo bashrc-read-only; fi
if [ -f /.flatpak-info ]; then cat /.flatpak-info /etc/passwd; readlink /var/run; hostname; fi
echo written > out.txt && echo wrote
python3 -c 'import socket, sys; print(socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2).recv(16).decode().strip())' "$PORT" 2>/dev/null || echo no-network
exit 7`

// clientLine is the argv (after the program) of one real client of
// bubblewrap, rebuilt from its public source's shape with this test's
// paths (work: the project/workspace dir; nested: how many nested git
// repositories it holds).
//
//   - codex-rw, codex-ro: OpenAI Codex CLI's Linux sandbox, bubblewrap
//     pipeline (codex-rs/linux-sandbox/src/bwrap.rs,
//     create_bwrap_flags): --new-session --die-with-parent, the root
//     read-only, a fresh /dev, then each writable root bound (the
//     workspace, workspace-write only) and its protected subpaths (.git,
//     .codex) bound read-only again, --unshare-pid, --unshare-net unless
//     the policy has network access, --proc /proc, then the command. Run
//     here with network access (no --unshare-net) for workspace-write and
//     without it for read-only.
//   - srt, srt-net: Anthropic's sandbox-runtime (src/sandbox/
//     linux-sandbox-utils.ts, wrapCommandWithSandboxLinux and
//     generateFilesystemArgs): --new-session --die-with-parent,
//     --unshare-net when the network is restricted (srt-net, no proxy
//     sockets: no network), the root read-only, the allowed write paths
//     bound, the mandatory deny paths inside them (.bashrc, .git/hooks,
//     .git/config of the workspace and of every nested repository its
//     ripgrep finds) bound read-only, --dev /dev, --unshare-pid, --proc
//     /proc, -- the shell -c the command.
//   - flatpak: a Flatpak-style app line (flatpak's common/flatpak-run.c
//     shape): every namespace but the network (--unshare-all
//     --share-net), /usr and the merged-/usr symlinks, --file for
//     /.flatpak-info, --ro-bind-data for /etc/passwd and /etc/group,
//     --symlink ../run /var/run, a runtime dir, --hostname, the app's
//     data dir bound writable (/var/app here, not ~/.var/app/ID: the
//     caller is root or nobody).
func clientLine(kind, work string, nested int) []string {
	shell := []string{"/bin/sh", "-c", clientProbe}
	switch kind {
	case "codex-rw", "codex-ro":
		line := []string{"--new-session", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev"}
		if kind == "codex-rw" {
			line = append(line, "--bind", work, work,
				"--ro-bind", filepath.Join(work, ".git"), filepath.Join(work, ".git"),
				"--ro-bind", filepath.Join(work, ".codex"), filepath.Join(work, ".codex"))
		}
		line = append(line, "--unshare-pid")
		if kind == "codex-ro" {
			line = append(line, "--unshare-net")
		}
		return append(append(line, "--proc", "/proc", "--"), shell...)
	case "srt", "srt-net":
		line := []string{"--new-session", "--die-with-parent"}
		if kind == "srt-net" {
			line = append(line, "--unshare-net")
		}
		line = append(line, "--ro-bind", "/", "/", "--bind", work, work)
		deny := []string{".bashrc", ".git/hooks", ".git/config"}
		for i := 0; i < nested; i++ {
			deny = append(deny, fmt.Sprintf("lib%03d/.git/hooks", i), fmt.Sprintf("lib%03d/.git/config", i))
		}
		for _, d := range deny {
			line = append(line, "--ro-bind", filepath.Join(work, d), filepath.Join(work, d))
		}
		line = append(line, "--dev", "/dev", "--unshare-pid", "--proc", "/proc", "--")
		return append(line, shell...)
	case "flatpak":
		line := []string{"--unshare-all", "--share-net", "--die-with-parent", "--new-session", "--hostname", "app",
			"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
			"--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin", "--proc", "/proc", "--dev", "/dev",
			"--tmpfs", "/tmp", "--dir", "/run/user/app", "--setenv", "XDG_RUNTIME_DIR", "/run/user/app",
			"--file", "3", "/.flatpak-info", "--ro-bind-data", "4", "/etc/passwd", "--ro-bind-data", "5", "/etc/group",
			"--symlink", "../run", "/var/run", "--bind", work, "/var/app", "--chdir", "/var/app", "--"}
		return append(line, shell...)
	}
	panic(kind)
}

// clientFixture makes the workspace a line binds: .bashrc, a .git with
// hooks/ and config, .codex, and nested repositories, all owned by
// owner (as a user's project is: as root, str binds a writable source
// id-mapped to its owner).
func clientFixture(t *testing.T, owner, nested int) string {
	t.Helper()
	if err := os.MkdirAll("/srv", 0o755); err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp("/srv", "str-bwrap-client-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	dirs := []string{".git/hooks", ".codex"}
	files := []string{".bashrc", ".git/config"}
	for i := 0; i < nested; i++ {
		dirs = append(dirs, fmt.Sprintf("lib%03d/.git/hooks", i))
		files = append(files, fmt.Sprintf("lib%03d/.git/config", i))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(work, f), []byte("# "+f+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Writable by all: where a line binds it writable, the command may
	// write under bubblewrap as root too, whose --unshare-all maps only
	// root (to whom owner's files are not root's); what must stay
	// read-only is the line's read-only binds' doing, not the modes'.
	if err := filepath.Walk(work, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o666)
		if fi.IsDir() {
			mode = 0o777
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
		return os.Lchown(p, owner, owner)
	}); err != nil {
		t.Fatal(err)
	}
	return work
}

// loopbackService listens on the caller's 127.0.0.1 and greets each
// connection: a line on the caller's network reaches it, one that
// unshares the network does not.
func loopbackService(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// The real clients' lines (clientLine) give the command the same view
// under str bwrap as under the machine's bubblewrap, as root and as
// uid 65534: identity, cwd, /, environment (nothing added: no proxy
// variables), read-only paths, the write seen on the host, the caller's
// loopback service reached exactly when the line does not unshare the
// network, and the exit status. srt-many is srt's line for a workspace
// with 160 nested repositories: 320 deny binds, beyond the old limit of
// 30 bind sources.
func TestBwrapClientLines(t *testing.T) {
	needRoot(t)
	bw, err := exec.LookPath("bwrap")
	if err != nil {
		mustwork.Skip(t, "no bwrap on this machine to compare with")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		mustwork.Skip(t, "needs /usr/bin/python3 (the probe's network check)")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		mustwork.Skip(t, "needs setpriv (util-linux) to drop to an unprivileged uid")
	}
	// A copy of str that uid 65534 may execute (t.TempDir's parent is
	// 0700).
	if err := os.MkdirAll("/srv", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/srv", "str-bwrap-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	bin := strCopyIn(t, dir)
	port := loopbackService(t)
	const nobody = 65534
	moves := delegatedCgroupMoves(t, nobody)
	for _, kind := range []string{"codex-rw", "codex-ro", "srt", "srt-net", "srt-many", "flatpak"} {
		for _, uid := range []int{0, nobody} {
			t.Run(fmt.Sprintf("%s/uid%d", kind, uid), func(t *testing.T) {
				if uid != 0 && len(moves) == 0 {
					mustwork.Skip(t, "no cgroup v1 controllers to delegate to uid 65534 (a v2 host runs the rootless tests in the VM)")
				}
				owner, nested, line := 4242, 0, kind
				if uid != 0 {
					owner = nobody
				}
				if kind == "srt-many" {
					nested, line = 160, "srt"
				}
				work := clientFixture(t, owner, nested)
				args := clientLine(line, work, nested)
				if kind == "srt-many" && len(args) < 600 {
					t.Fatalf("srt-many: %d arguments, want 300+ binds", len(args))
				}
				runs := map[string]string{}
				for _, who := range []struct{ name, prog string }{{"bubblewrap", bw}, {"str bwrap", bin}} {
					a := args
					if who.name == "str bwrap" {
						a = append([]string{"bwrap"}, args...)
					}
					var cmd *exec.Cmd
					if uid == 0 {
						cmd = exec.Command(who.prog, a...)
					} else {
						script := strings.Join(moves, " && ") + fmt.Sprintf(` && exec setpriv --reuid %d --regid %d --clear-groups "$@"`, uid, uid)
						cmd = exec.Command("/bin/sh", append([]string{"-c", script, "sh", who.prog}, a...)...)
					}
					cmd.Dir = work
					cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "LANG=C.UTF-8", "PORT=" + strconv.Itoa(port)}
					if line == "flatpak" {
						for _, s := range []string{"[Application]\nname=org.example.App\n", "app:x:1000:1000::/var/app:/bin/sh\n", "app:x:1000:\n"} {
							r, w, err := os.Pipe()
							if err != nil {
								t.Fatal(err)
							}
							_, _ = w.WriteString(s)
							w.Close()
							cmd.ExtraFiles = append(cmd.ExtraFiles, r)
							defer r.Close()
						}
					}
					// What the other's run left (a file of its owner's) is
					// not this run's to touch.
					os.Remove(filepath.Join(work, "out.txt"))
					os.Remove(filepath.Join(work, ".git", "hooks", "probe"))
					out, err := cmd.Output()
					code := 0
					if ee, ok := err.(*exec.ExitError); ok {
						code = ee.ExitCode()
						if code != 7 {
							t.Errorf("%s: exit %d, want the command's 7\n%s%s", who.name, code, out, ee.Stderr)
						}
					} else if err != nil || code != 7 {
						t.Errorf("%s: %v, exit %d, want 7\n%s", who.name, err, code, out)
					}
					// codex's read-only policy binds nothing writable.
					if got, err := os.ReadFile(filepath.Join(work, "out.txt")); kind != "codex-ro" && (err != nil || string(got) != "written\n") {
						t.Errorf("%s: the command's file on the host: %q %v", who.name, got, err)
					} else if kind == "codex-ro" && err == nil {
						t.Errorf("%s: the read-only line wrote %q on the host", who.name, got)
					}
					runs[who.name] = string(out)
				}
				if runs["bubblewrap"] != runs["str bwrap"] {
					t.Errorf("the command saw different things:\nbubblewrap:\n%s\nstr bwrap:\n%s", runs["bubblewrap"], runs["str bwrap"])
				}
				wantNet := "hello"
				if kind == "codex-ro" || kind == "srt-net" {
					wantNet = "no-network"
				}
				if !strings.Contains(runs["str bwrap"], "\n"+wantNet+"\n") {
					t.Errorf("str bwrap: want %q from the network check:\n%s", wantNet, runs["str bwrap"])
				}
			})
		}
	}
}
