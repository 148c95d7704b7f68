package hostile

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"
)

// cases is the battery. Names are stable: SECURITY.md's "Tested by"
// table names them as TestHostile/<name>.
func cases() []hcase {
	int80Outcome, _ := int80Want()
	var cs []hcase
	add := func(c ...hcase) { cs = append(cs, c...) }

	// ---- filesystem
	add(per(all, hcase{name: "fs_etc_shadow", py: "read_shadow", want: "ENOENT"})...)
	add(
		hcase{name: "fs_worker_manifest", profile: "standard", py: "read_host_path", args: map[string]any{"path": "{manifest}"}, want: "ENOENT"},
		hcase{name: "fs_worker_environ", profile: "standard", py: "read_host_path", args: map[string]any{"path": "/proc/{workerpid}/environ"}, want: "ENOENT"},
		hcase{name: "fs_broker_token", profile: "standard", py: "read_host_path", args: map[string]any{"path": "{token}"}, want: "ENOENT"},
		hcase{name: "fs_host_file", profile: "permissive", py: "read_host_path", args: map[string]any{"path": "{hostfile}"}, want: "ENOENT"},
		hcase{name: "fs_artifact_store", profile: "permissive", py: "read_host_path", args: map[string]any{"path": "{artifacts}/e2e/u-2/s-1/secret.txt/0"}, want: "ENOENT"},
		hcase{name: "fs_write_tools_dir", profile: "standard", py: "write_tools_dir", want: "EROFS"},
		hcase{name: "fs_write_usr", profile: "permissive", py: "write_path", args: map[string]any{"path": "/usr/pwned"}, want: "EROFS"},
		hcase{name: "fs_write_root", profile: "standard", py: "write_path", args: map[string]any{"path": "/pwned"}, want: "EROFS"},
		hcase{name: "fs_write_etc_passwd", profile: "standard", py: "write_path", args: map[string]any{"path": "/etc/passwd"}, want: "EROFS"},
		hcase{name: "output_symlink", profile: "restrictive", args: map[string]any{"host_file": "{hostfile}"}, want: "planted", check: onlyOK},
		hcase{name: "output_hardlink", profile: "restrictive", want: "EXDEV,EPERM", check: onlyOK,
			params: map[string]any{"preloaded_artifacts": map[string]any{"secret": map[string]any{"filename": "in.txt", "content": "aW5wdXQ="}}}},
		hcase{name: "output_fifo", profile: "standard", want: "ok", check: onlyOK},
		hcase{name: "output_fifo_restrictive", profile: "restrictive", py: "output_fifo", want: "ENOSYS", check: onlyOK},
		hcase{name: "output_device", profile: "standard", want: "EPERM,EPERM", check: onlyOK},
		hcase{name: "output_device_restrictive", profile: "restrictive", py: "output_device", want: "ENOSYS,ENOSYS", check: onlyOK},
		hcase{name: "output_symlink_swap", profile: "standard", py: "output_swap", args: map[string]any{"host_file": "{hostfile}"}, want: "planted",
			check: func(t *testing.T, h *harness, r reply, _ map[string]any) {
				for _, c := range r.Result.Created {
					if c.Filename != "x.txt" || c.SizeBytes != int64(len("original")) {
						t.Fatalf("stored %s (%d bytes): only x.txt as written may be stored", c.Filename, c.SizeBytes)
					}
				}
			}},
		hcase{name: "output_100k_files", profile: "standard", py: "output_many", code: "ARTIFACT_ERROR", msg: "more than 1000 files"},
		hcase{name: "output_name_fullwidth_dots", profile: "restrictive", py: "raw_output", args: map[string]any{"names": []any{"\uff0e\uff0e", "a\uff0fb"}}, want: "planted",
			check: func(t *testing.T, _ *harness, r reply, _ map[string]any) {
				onlyOK(t, nil, r, nil)
				if len(r.Result.Skipped) != 2 {
					t.Fatalf("skipped_outputs %v: want both look-alike names skipped", r.Result.Skipped)
				}
			}},
		hcase{name: "output_name_user_scope", profile: "restrictive", py: "raw_output", args: map[string]any{"names": []any{"user:planted.txt"}}, want: "planted",
			check: onlyOK},
		hcase{name: "fsize_efbig", profile: "restrictive", args: map[string]any{"size": 64 << 20}, want: "EFBIG"},
		hcase{name: "fsize_efbig_permissive", profile: "permissive", py: "fsize_efbig", args: map[string]any{"size": 1 << 30}, want: "EFBIG"},
		hcase{name: "fsize_sigxfsz", profile: "restrictive", args: map[string]any{"size": 64 << 20}, want: "signal:SIGXFSZ"},
		hcase{name: "fill_tmp", profile: "restrictive", py: "fill_dir", args: map[string]any{"dir": "/tmp"}, want: "ENOSPC", check: atMost(64 << 20)},
		hcase{name: "fill_dev_shm", profile: "restrictive", py: "fill_dir", args: map[string]any{"dir": "/dev/shm"}, want: "ENOSPC", check: atMost(16 << 20)},
		hcase{name: "fill_dev_shm_confidential", profile: "confidential", py: "fill_dir", args: map[string]any{"dir": "/dev/shm"}, want: "ENOENT"},
		hcase{name: "fill_workdir", profile: "restrictive", py: "fill_dir", args: map[string]any{"dir": ".", "limit": 1 << 30, "keep": true}, want: "ENOSPC", check: atMost(256 << 20)},
		hcase{name: "fill_workdir_inodes", profile: "restrictive", py: "fill_inodes", want: "ENOSPC"},
		hcase{name: "other_task_workdir", profile: "restrictive", run: otherTaskWorkdir},
		hcase{name: "proc_self_exe", profile: "restrictive", want: "EACCES"},
		hcase{name: "proc_1_exe", profile: "restrictive", want: "EACCES",
			check: func(t *testing.T, _ *harness, _ reply, res map[string]any) {
				if exe, _ := res["exe"].(string); !strings.HasPrefix(exe, "/usr/bin/python3") || res["pid"] != 1.0 {
					t.Fatalf("PID 1 is %v (%v), want the tool's python3 (the init replaced itself)", exe, res["pid"])
				}
			}},
		hcase{name: "proc_1_root", profile: "restrictive", want: "ENOENT",
			check: func(t *testing.T, _ *harness, _ reply, res map[string]any) {
				if res["same_as_root"] != true || res["escape"] != "ENOENT" {
					t.Fatalf("/proc/1/root is not the sandbox's root: %v", res)
				}
			}},
		hcase{name: "proc_self_fd", profile: "restrictive", want: "dirs:0"},
		hcase{name: "cwd_escape", profile: "restrictive", want: "/,/",
			check: func(t *testing.T, _ *harness, _ reply, res map[string]any) {
				for _, e := range res["entries"].([]any) {
					if s := e.(string); s == "root" || s == "home" || s == "boot" || s == "sys" || s == "opt" || s == "srv" {
						t.Fatalf("the sandbox's / holds the host's %s: %v", s, res["entries"])
					}
				}
			}},
		hcase{name: "proc_write", profile: "standard", want: procDenied("/proc/sysrq-trigger") + ",EACCES,EINVAL"},
		hcase{name: "proc_read_kernel", profile: "standard", py: "proc_read", want: procDenied("/proc/kcore") + ",EACCES"},
		hcase{name: "dev_write", profile: "permissive", py: "write_path", args: map[string]any{"path": "/dev/evil"}, want: "EACCES"},
		hcase{name: "sys_absent", profile: "permissive", py: "sys", want: "ENOENT"},
		hcase{name: "dev_minimal", profile: "permissive", py: "dev", want: "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero",
			check: func(t *testing.T, _ *harness, _ reply, res map[string]any) {
				if res["mem"] != "ENOENT" || res["kmsg"] != "ENOENT" {
					t.Fatalf("/dev/mem %v, /dev/kmsg %v: want ENOENT", res["mem"], res["kmsg"])
				}
			}},
	)

	// ---- package installation (install_test.go): each runs a worker of
	// its own whose manifest declares the hostile package.
	add(
		hcase{name: "install_sitecustomize", profile: "standard", run: installSitecustomize},
		hcase{name: "install_pth", profile: "standard", run: installPth},
		hcase{name: "install_sdist_refused", profile: "standard", run: installSdistRefused},
		hcase{name: "install_sdist_build_sandboxed", profile: "standard", run: installSdistBuild},
		hcase{name: "install_index_only", profile: "standard", run: installIndex},
		hcase{name: "install_index_offsite_link", profile: "standard", run: installIndexOffsite},
		hcase{name: "install_shadow_module", profile: "standard", run: installShadow},
	)

	// ---- processes
	add(per(all, hcase{name: "procs_visible", py: "procs", want: "1"})...)
	add(
		hcase{name: "signal_host", profile: "standard", py: "signal_host", args: map[string]any{"pid": "{testpid}"}, want: "ESRCH,ESRCH"},
		hcase{name: "ptrace", profile: "standard", want: "EPERM,EPERM,exit:1"},
		hcase{name: "process_vm_readv", profile: "standard", want: "EPERM"},
		hcase{name: "fork_bomb", profile: "restrictive", want: "EAGAIN", check: forkedAtMost(31)},
		hcase{name: "fork_bomb_standard", profile: "standard", py: "fork_bomb", want: "EAGAIN", check: forkedAtMost(127)},
		hcase{name: "zombie_pileup", profile: "restrictive", py: "zombies", want: "EAGAIN", check: forkedAtMost(31)},
		hcase{name: "daemon_dies_with_sandbox", profile: "standard", run: daemonDies},
		hcase{name: "nothing_survives_next_call", profile: "standard", run: nothingSurvives},
		hcase{name: "concurrent_process_limits", profile: "restrictive", run: concurrentNproc},
	)

	// ---- privilege
	add(per(all, hcase{name: "caps_zero", py: "caps", want: "0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000"})...)
	add(per(all, hcase{name: "seccomp_nnp", want: "seccomp=2 nnp=1"})...)
	add(per([]string{"restrictive", "standard"}, hcase{name: "unshare", want: "EPERM,EPERM,EPERM,EPERM"})...)
	add(per([]string{"restrictive", "permissive"}, hcase{name: "mount", want: "EPERM,EPERM,EPERM"})...)
	add(
		hcase{name: "setuid_binary", profile: "standard", want: "65534"},
		hcase{name: "setuid_root", profile: "standard", py: "setuid0", want: "EPERM,EPERM,EPERM"},
		hcase{name: "pivot_root_chroot", profile: "restrictive", py: "pivot_root", want: "EPERM,EPERM"},
		hcase{name: "keyctl", profile: "standard", want: "EPERM,EPERM"},
		hcase{name: "bpf", profile: "permissive", want: "EPERM"},
		hcase{name: "perf_event_open", profile: "permissive", py: "perf", want: "EPERM"},
		hcase{name: "userfaultfd", profile: "standard", want: "EPERM,ENOENT"},
		hcase{name: "io_uring_setup", profile: "permissive", py: "io_uring", want: "EPERM"},
		hcase{name: "kernel_modules_kexec", profile: "permissive", py: "modules", want: "EPERM,EPERM,EPERM"},
		hcase{name: "tiocsti_tioclinux", profile: "standard", py: "ioctl_tty", want: "EPERM,EPERM,EPERM,EPERM,EPERM"},
		hcase{name: "personality", profile: "standard", want: "EPERM,EPERM,EPERM,EPERM"},
		hcase{name: "clone_namespaces", profile: "standard", py: "clone_ns", want: "ENOSYS,ENOSYS,EPERM,EPERM,ok"},
		hcase{name: "x32_syscall", profile: "standard", py: "x32", want: "signal:SIGSYS"},
		hcase{name: "int80_syscall", profile: "standard", py: "int80", want: int80Outcome},
		hcase{name: "open_by_handle_at", profile: "permissive", py: "open_by_handle", want: "EPERM"},
		hcase{name: "setns_sethostname", profile: "standard", py: "setns", want: "EPERM,EPERM"},
		hcase{name: "socket_families", profile: "standard", want: "EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EPERM,EAFNOSUPPORT,EAFNOSUPPORT"},
	)

	// ---- network
	add(per(all, hcase{name: "net_host_loopback", py: "connect", args: map[string]any{"host": "127.0.0.1", "port": "{listener}"}, want: "ECONNREFUSED"})...)
	add(per(all, hcase{name: "net_broker", py: "connect", args: map[string]any{"host": "127.0.0.1", "port": "{broker}"}, want: "ECONNREFUSED"})...)
	add(per(all, hcase{name: "net_health", py: "connect", args: map[string]any{"host": "127.0.0.1", "port": "{health}"}, want: "ECONNREFUSED"})...)
	add(per(all, hcase{name: "net_host_address", py: "connect", args: map[string]any{"host": "{hostaddr}", "port": "{hostport}"}, want: "ENETUNREACH"})...)
	add(per(all, hcase{name: "net_abstract_unix", py: "abstract", args: map[string]any{"name": "{abstract}"}, want: "ECONNREFUSED"})...)
	add(per(all, hcase{name: "net_interfaces", py: "interfaces", want: "lo"})...)
	add(per(isolated, hcase{name: "net_proxy_broker", py: "proxy", args: map[string]any{"target": "127.0.0.1:{broker}"}, want: "403", check: violation("isolated")})...)
	add(per(egress, hcase{name: "net_proxy_broker", py: "proxy", args: map[string]any{"target": "127.0.0.1:{broker}"}, want: "403", check: violation("private_address")})...)
	add(per(egress, hcase{name: "net_proxy_host_address", py: "proxy", args: map[string]any{"target": "{hostaddr}:{hostport}"}, want: "403", check: violation("private_address")})...)
	add(per([]string{"restrictive", "confidential", "restricted"}, hcase{name: "dns_not_allowed", py: "dns", args: map[string]any{"name": "evil.example.net"}, want: "gaierror:-2"})...)
	add(hcase{name: "dns_allowed_fake_ip", profile: "restricted", py: "dns", args: map[string]any{"name": "api.example.com"}, want: "resolved"})

	// ---- resources
	add(
		hcase{name: "memory_hog", profile: "restrictive", code: "SANDBOX_FAILED", msg: "out of memory"},
		hcase{name: "cpu_spin", profile: "short", timedOut: true},
		hcase{name: "sleep_past_timeout", profile: "short", py: "sleep", timedOut: true},
		hcase{name: "rlimits_restrictive", profile: "restrictive", py: "rlimits", want: "AS=536870912 CPU=60 FSIZE=67108864 NOFILE=128 NPROC=32 STACK=8388608 CORE=0"},
		hcase{name: "rlimits_standard", profile: "standard", py: "rlimits", want: "AS=1073741824 CPU=300 FSIZE=268435456 NOFILE=512 NPROC=128 STACK=8388608 CORE=0"},
		// 260 lines of 64 KiB: just over the 16 MiB a task may publish, so
		// both caps act (each line cut to 64 KiB, the last 4 dropped) while
		// the tool, slowed to the broker's pace, moves little data.
		hcase{name: "status_flood", profile: "restrictive", args: map[string]any{"n": 260, "size": 65536}, want: "flooded",
			check: func(t *testing.T, h *harness, _ reply, _ map[string]any) {
				// Every relayed line is bounded (64 KiB), however many the tool wrote.
				for _, st := range h.a.statusesWith("xxxx") {
					if len(st) > 64<<10 {
						t.Fatalf("a status line of %d bytes was relayed", len(st))
					}
				}
				// What is over the task's cap is dropped and announced.
				if n := len(h.a.statusesWith("4 status lines (262144 bytes) were dropped: more than 16777216 bytes of status text")); n != 1 {
					t.Fatalf("%d drop notices for the 4 lines over the cap, want 1", n)
				}
			}},
		hcase{name: "huge_result", profile: "standard", code: "TOOL_ERROR"},
		hcase{name: "deep_result", profile: "standard", py: "raw_result", args: map[string]any{"kind": "deep"}, code: "TOOL_ERROR", msg: "nested too deeply"},
		hcase{name: "nonutf8_result", profile: "standard", py: "raw_result", args: map[string]any{"kind": "nonutf8"}, want: "bad \ufffd\ufffd bytes"},
		hcase{name: "garbage_result", profile: "standard", py: "raw_result", args: map[string]any{"kind": "garbage"}, code: "SANDBOX_FAILED", msg: "unusable result"},
	)

	// ---- information
	add(per(all, hcase{name: "worker_env_secret", py: "environment", args: map[string]any{"secret": "{secret}"}, want: "found:0"})...)
	add(per(all, hcase{name: "hostname_machine_id", py: "identity", want: "sandbox ENOENT ENOENT"})...)
	ref := func(name string) map[string]any {
		return map[string]any{"artifact_references": map[string]any{"f": map[string]any{"filename": name}}}
	}
	add(
		hcase{name: "artifact_control_own", profile: "restrictive", py: "load_artifact", want: "'U2-SECRET'",
			params: map[string]any{"session_id": "s-1", "artifact_references": map[string]any{"f": map[string]any{"filename": "mine.txt"}}}},
		hcase{name: "artifact_dotdot", profile: "restrictive", py: "load_artifact", params: ref("../../u-2/s-1/secret.txt"), code: "INVALID_REQUEST"},
		hcase{name: "artifact_absolute", profile: "restrictive", py: "load_artifact", params: ref("{artifacts}/e2e/u-2/s-1/secret.txt"), code: "INVALID_REQUEST"},
		hcase{name: "artifact_nul", profile: "restrictive", py: "load_artifact", params: ref("secret.txt\x00/../../u-2"), code: "INVALID_REQUEST"},
		hcase{name: "artifact_user_dotdot", profile: "restrictive", py: "load_artifact", params: ref("user:../../u-2/user/secret.txt"), code: "INVALID_REQUEST"},
		hcase{name: "artifact_user_other", profile: "restrictive", py: "load_artifact", params: ref("user:secret.txt"), code: "ARTIFACT_ERROR"},
		hcase{name: "artifact_fullwidth_dots", profile: "restrictive", py: "load_artifact", params: ref("\uff0e\uff0e\uff0f\uff0e\uff0e\uff0fu-2\uff0fs-1\uff0fsecret.txt"), code: "INVALID_REQUEST"},
		hcase{name: "artifact_session_traversal", profile: "restrictive", py: "load_artifact",
			params: map[string]any{"session_id": "..\uff0fu-2", "artifact_references": map[string]any{"f": map[string]any{"filename": "secret.txt"}}}, code: "INVALID_REQUEST"},
		hcase{name: "artifact_session_user", profile: "restrictive", py: "load_artifact",
			params: map[string]any{"session_id": "user", "artifact_references": map[string]any{"f": map[string]any{"filename": "secret.txt"}}}, code: "INVALID_REQUEST"},
	)
	return cs
}

// procDenied is how the sandbox's fresh procfs refuses a root-only
// kernel file: ENOENT where this kernel has no such file (built without
// CONFIG_PROC_KCORE or CONFIG_MAGIC_SYSRQ, like the CI host's), else
// EACCES (the file is root's, mode 0400 or 0200, and the tool is not
// root of the host's user namespace). The sandbox shares the host's
// kernel, so the host's /proc says which.
func procDenied(path string) string {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "ENOENT"
	}
	return "EACCES"
}

func atMost(n float64) func(*testing.T, *harness, reply, map[string]any) {
	return func(t *testing.T, _ *harness, _ reply, res map[string]any) {
		if b, _ := res["bytes"].(float64); b > n || b == 0 {
			t.Fatalf("wrote %v bytes, want more than 0 and at most %v", res["bytes"], n)
		}
	}
}

func forkedAtMost(n float64) func(*testing.T, *harness, reply, map[string]any) {
	return func(t *testing.T, _ *harness, _ reply, res map[string]any) {
		if f, _ := res["forked"].(float64); f > n || f == 0 {
			t.Fatalf("forked %v processes, want more than 0 and at most %v", res["forked"], n)
		}
	}
}

// violation: the reply records the denial with this reason.
func violation(reason string) func(*testing.T, *harness, reply, map[string]any) {
	return func(t *testing.T, _ *harness, r reply, _ map[string]any) {
		for _, v := range r.Result.Violations {
			if v.Kind == "net" && v.Reason == reason {
				return
			}
		}
		t.Fatalf("no net violation %q in the reply: %+v", reason, r.Result.Violations)
	}
}

// workDirOf is the work dir the worker logged for request id ("" if
// none yet): work dirs are named by the worker, not after task ids.
func (w *workerProc) workDirOf(id string) string {
	for _, line := range strings.Split(w.log.String(), "\n") {
		var rec map[string]any
		if strings.Contains(line, "work dir made") && json.Unmarshal([]byte(line), &rec) == nil && rec["id"] == id {
			p, _ := rec["path"].(string)
			return p
		}
	}
	return ""
}

// otherTaskWorkdir: a task holds its sandbox while another tries its
// work dir by host path and lists its own work dir's parent.
func otherTaskWorkdir(t *testing.T, h *harness, _ hcase) {
	holder := h.a.invoke("h_restrictive", map[string]any{"args": map[string]any{"case": "holder", "hold": 120}, "session_id": "s-holder"})
	defer func() { h.a.cancel(holder); h.a.reply(t, holder, rpcWait) }()
	waitFor(t, "the holder's status", rpcWait, func() bool { return len(h.a.status(holder)) > 0 })
	var dir string // named by the worker, not after the task id
	waitFor(t, "the holder's work dir logged", rpcWait, func() bool { dir = h.w.workDirOf(holder); return dir != "" })
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the holder's work dir %s: %v", dir, err)
	}
	r, res, raw, _ := h.call(t, "restrictive", "other_workdir", map[string]any{"path": dir}, nil)
	if r.Result == nil || res["outcome"] != "ENOENT" {
		t.Fatalf("another task's work dir: want ENOENT, got %s", raw)
	}
	if sib, _ := json.Marshal(res["siblings"]); string(sib) != `["`+res["own"].(string)+`"]` {
		t.Fatalf("the work dir's parent shows %s, want only the task's own dir %v", sib, res["own"])
	}
}

// daemonDies: a double-forked, setsid'd daemon is gone from the host
// once the sandbox is torn down.
func daemonDies(t *testing.T, h *harness, c hcase) {
	marker := "4242" + strings.TrimPrefix(newID(""), "-")
	marker = strings.ReplaceAll(marker, "-", "")
	r, res, raw, _ := h.call(t, c.profile, "daemon", map[string]any{"marker": marker}, nil)
	if r.Result == nil || res["outcome"] != "left" {
		t.Fatalf("daemon: %s", raw)
	}
	waitFor(t, "the daemon gone from the host", time.Minute, func() bool { return len(findProcs("600."+marker)) == 0 })
}

// nothingSurvives: one call leaves a daemon and files in /tmp, /dev/shm
// and its work dir; the next call of the same tool finds none of them.
func nothingSurvives(t *testing.T, h *harness, c hcase) {
	marker := strings.ReplaceAll("4343"+newID(""), "-", "")
	if r, res, raw, _ := h.call(t, c.profile, "leave_traces", map[string]any{"marker": marker}, nil); r.Result == nil || res["outcome"] != "left" {
		t.Fatalf("leave: %s", raw)
	}
	if r, res, raw, _ := h.call(t, c.profile, "find_traces", map[string]any{"marker": marker}, nil); r.Result == nil || res["outcome"] != "found:0" {
		t.Fatalf("the next call found traces: %s", raw)
	}
}

// concurrentNproc: two sandboxes each hold all the processes they may,
// at the same time; each gets its own limit (no shared RLIMIT_NPROC uid).
func concurrentNproc(t *testing.T, h *harness, _ hcase) {
	ids := []string{}
	for i := 0; i < 2; i++ {
		ids = append(ids, h.a.invoke("h_restrictive", map[string]any{"args": map[string]any{"case": "concurrent_nproc", "hold": 100}, "session_id": "s-nproc"}))
	}
	held := map[string]string{}
	waitFor(t, "both sandboxes holding their processes", rpcWait, func() bool {
		for _, id := range ids {
			if st := h.a.status(id); len(st) > 0 {
				held[id] = st[0]
			}
		}
		return len(held) == 2
	})
	for _, id := range ids {
		if h.a.hasReply(id) {
			t.Fatalf("%s ended before both held their processes: not concurrent", id)
		}
		if held[id] != "holding 31" {
			t.Errorf("%s: %q, want every sandbox to hold its own 31 children", id, held[id])
		}
		h.a.cancel(id)
	}
	for _, id := range ids {
		h.a.reply(t, id, rpcWait)
	}
}
