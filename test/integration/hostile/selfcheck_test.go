package hostile

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
)

// selfCheck is the example tool self_check's report.
type selfCheck struct {
	Namespaces   map[string]uint64 `json:"namespaces"`
	Capabilities map[string]string `json:"capabilities"`
	Seccomp      string            `json:"seccomp"`
	NoNewPrivs   string            `json:"no_new_privs"`
	Mounts       []struct {
		Path, Fstype string
		RW           bool
	} `json:"mounts"`
	Processes  map[string]string `json:"processes"`
	Interfaces []string          `json:"interfaces"`
	UID        []int             `json:"uid"`
	GID        []int             `json:"gid"`
	Groups     []int             `json:"groups"`
	UIDMap     []string          `json:"uid_map"`
	GIDMap     []string          `json:"gid_map"`
	Hostname   string            `json:"hostname"`
}

// TestSelfCheck runs the example tool self_check (examples/tools) through
// the worker under restrictive and standard and checks every field of its
// report against what the sandbox must be.
func TestSelfCheck(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, manifest)
	w := startWorker(t, e, nil)
	a := newAgent(t, w.port)
	for _, tool := range []string{"self_check", "self_check_standard"} {
		t.Run(tool, func(t *testing.T) {
			raw := a.reply(t, a.invoke(tool, nil), rpcWait)
			var r reply
			must(t, json.Unmarshal(raw, &r))
			if r.Result == nil {
				t.Fatalf("self_check failed: %s", raw)
			}
			var sc selfCheck
			must(t, json.Unmarshal(r.Result.ToolResult, &sc))
			checkSelf(t, sc)
			if t.Failed() {
				t.Logf("report: %s", r.Result.ToolResult)
			}
		})
	}
}

var devices = map[string]bool{"/dev/null": true, "/dev/zero": true, "/dev/full": true, "/dev/random": true, "/dev/urandom": true, "/dev/tty": true}

func checkSelf(t *testing.T, sc selfCheck) {
	t.Helper()
	// Namespaces: every one the sandbox must have is another than the host's.
	for _, ns := range []string{"user", "pid", "mnt", "ipc", "uts", "cgroup", "net"} {
		var st syscall.Stat_t
		must(t, syscall.Stat("/proc/self/ns/"+ns, &st))
		in, ok := sc.Namespaces[ns]
		if !ok || in == 0 || in == st.Ino {
			t.Errorf("namespace %s: inside %d, host %d: want its own", ns, in, st.Ino)
		}
	}
	for k, v := range sc.Capabilities {
		if v != "0000000000000000" {
			t.Errorf("%s = %s, want every capability set empty", k, v)
		}
	}
	if len(sc.Capabilities) != 5 {
		t.Errorf("capability sets reported: %v", sc.Capabilities)
	}
	if sc.Seccomp != "2" || sc.NoNewPrivs != "1" {
		t.Errorf("seccomp %q no_new_privs %q, want 2 (filter) and 1", sc.Seccomp, sc.NoNewPrivs)
	}
	// Mounts: / read-only; writable only the work dir (under /tmp's tree
	// or its own path), /tmp, /dev/shm and the kernel's own /proc and /dev/pts.
	rootSeen := false
	for _, m := range sc.Mounts {
		if m.Path == "/" {
			rootSeen = true
			if m.RW {
				t.Errorf("/ is mounted read-write")
			}
		}
		if m.Path == "/sys" || strings.HasPrefix(m.Path, "/sys/") {
			t.Errorf("/sys is mounted: %s", m.Path)
		}
		if !m.RW {
			continue
		}
		switch {
		case m.Path == "/tmp", m.Path == "/dev/shm", m.Path == "/proc", m.Path == "/dev/pts", m.Path == "/dev/mqueue":
		case m.Path == "/dev": // a tmpfs owned by the init's id: the tool cannot write it (TestHostile/dev_write)
		case m.Fstype == "devtmpfs" && devices[m.Path]: // the device nodes the profile binds
		case strings.Contains(m.Path, "/work/"):
		case templateMode && m.Path == "/str/work": // a template call's work dir (worker templateWorkTarget)
		default:
			t.Errorf("writable mount %s (%s) is not one the profile allows", m.Path, m.Fstype)
		}
	}
	if !rootSeen {
		t.Errorf("no / in the mount table")
	}
	if len(sc.Processes) != 1 || sc.Processes["1"] == "" || !strings.HasPrefix(sc.Processes["1"], "python") {
		t.Errorf("visible processes %v, want only PID 1 (the tool's python)", sc.Processes)
	}
	if strings.Join(sc.Interfaces, ",") != "lo" {
		t.Errorf("interfaces %v, want only lo", sc.Interfaces)
	}
	for _, id := range append(append([]int{}, sc.UID...), sc.GID...) {
		if id != 65534 {
			t.Errorf("uid %v gid %v, want 65534 throughout", sc.UID, sc.GID)
			break
		}
	}
	for _, g := range sc.Groups {
		if g != 65534 {
			t.Errorf("supplementary groups %v", sc.Groups)
		}
	}
	for name, m := range map[string][]string{"uid_map": sc.UIDMap, "gid_map": sc.GIDMap} {
		if templateMode {
			// A template call's namespace maps the tool's id alone (no
			// init ran in it), to an id of the template's namespace that
			// the supervisor mapped to a host id of the call's own
			// (verified from the host before the call's data is sent).
			if len(m) != 3 || m[0] != "65534" || m[2] != "1" {
				t.Errorf("%s %v: want 65534 alone mapped", name, m)
			}
			continue
		}
		// Two lines, the sandbox's block of host ids: 0 (the init, gone
		// once the tool runs) and 65534 (the tool), each to a host id of
		// its own, never host root or nobody, one id each.
		if len(m) != 6 || m[0] != "0" || m[3] != "65534" {
			t.Errorf("%s %v: want 0 and 65534 mapped", name, m)
			continue
		}
		for _, i := range []int{1, 4} {
			if m[i] == "0" || m[i] == "65534" || m[i+1] != "1" {
				t.Errorf("%s %v: maps host id %s (count %s)", name, m, m[i], m[i+1])
			}
		}
	}
	if sc.Hostname != "sandbox" {
		t.Errorf("hostname %q", sc.Hostname)
	}
}
