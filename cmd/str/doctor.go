package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	libseccomp "github.com/seccomp/libseccomp-golang"
	"github.com/securetoolruntime/str/launcher"
	"golang.org/x/sys/unix"
)

// cmdDoctor probes what str needs from the host and prints, for each
// missing piece, how to fix it. Exit 0 when a default sandbox can run.
func cmdDoctor(args []string) int {
	ok := true
	check := func(name string, good bool, detail, fix string) {
		mark := "ok  "
		if !good {
			mark = "FAIL"
			ok = false
		}
		fmt.Printf("[%s] %-28s %s\n", mark, name, detail)
		if !good && fix != "" {
			fmt.Printf("       fix: %s\n", fix)
		}
	}
	info := func(name, detail string) { fmt.Printf("[info] %-28s %s\n", name, detail) }

	var uts unix.Utsname
	_ = unix.Uname(&uts)
	info("kernel", unix.ByteSliceToString(uts.Release[:]))
	uid := os.Geteuid()
	info("running as", fmt.Sprintf("uid %d (%s mode)", uid, map[bool]string{true: "root", false: "rootless"}[uid == 0]))

	// User namespaces.
	maxUserNS := strings.TrimSpace(readFile("/proc/sys/user/max_user_namespaces"))
	unpriv := strings.TrimSpace(readFile("/proc/sys/kernel/unprivileged_userns_clone"))
	usernsOK := maxUserNS != "" && maxUserNS != "0" && unpriv != "0"
	check("user namespaces", usernsOK || uid == 0,
		fmt.Sprintf("max_user_namespaces=%s unprivileged_userns_clone=%s", orNA(maxUserNS), orNA(unpriv)),
		"sysctl -w user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1 (needed for rootless mode)")
	if apparmor := strings.TrimSpace(readFile("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")); apparmor == "1" && uid != 0 {
		check("apparmor userns restriction", false, "kernel.apparmor_restrict_unprivileged_userns=1",
			"allow str in an AppArmor profile with 'userns,' or run as root")
	}

	// cgroups.
	mode := launcher.DetectCgroup()
	switch mode {
	case launcher.CgroupV2:
		ctrl := strings.TrimSpace(readFile("/sys/fs/cgroup/cgroup.controllers"))
		check("cgroup", true, "v2 (unified), root controllers: "+ctrl, "")
		cgs, _ := launcher.OwnCgroups()
		own := cgs[""]
		w := unix.Access("/sys/fs/cgroup"+own, unix.W_OK) == nil
		check("cgroup delegation", w, "own cgroup "+own+map[bool]string{true: " is writable", false: " is not writable"}[w],
			"run as root, or under systemd with Delegate=yes (deploy/systemd/str-worker.service), or chown the subtree to this user")
	case launcher.CgroupV1:
		check("cgroup", true, "v1 controllers (hybrid/legacy): memory, pids, cpu via the v1 fallback; cgroup.kill emulated with freezer", "")
	default:
		check("cgroup", false, "no writable cgroup hierarchy",
			"run as root, delegate a cgroup v2 subtree (systemd Delegate=yes), or use a best_effort profile (no memory/pids/cpu limits)")
	}

	// Spawn latency: without favordynmods, every move of a process into a
	// cgroup (v1 attach, v2 migration) waits for an RCU grace period
	// (cgroup_threadgroup_rwsem): measured 6-19 ms per sandbox on cgroup v1
	// hosts. CLONE_INTO_CGROUP (v2) avoids the move entirely.
	mi := readFile("/proc/self/mountinfo")
	if mode == launcher.CgroupV1 && !strings.Contains(mi, "favordynmods") {
		info("cgroup attach latency", "favordynmods is off: each sandbox start on cgroup v1 waits for an RCU grace period (~5-20 ms)")
		fmt.Printf("       tune: mount -o remount,favordynmods /sys/fs/cgroup/unified (kernel >= 6.0; or boot with cgroup_favordynmods=1)\n")
	}

	// seccomp and libseccomp.
	seccompMode := strings.TrimSpace(fieldOf(readFile("/proc/self/status"), "Seccomp:"))
	check("seccomp", readFile("/proc/sys/kernel/seccomp/actions_avail") != "",
		"actions: "+strings.TrimSpace(readFile("/proc/sys/kernel/seccomp/actions_avail"))+"; this process Seccomp="+seccompMode,
		"a kernel with CONFIG_SECCOMP_FILTER")
	maj, min, micro := libseccomp.GetLibraryVersion()
	check("libseccomp", maj > 2 || (maj == 2 && min >= 5), fmt.Sprintf("%d.%d.%d", maj, min, micro), "apt-get install libseccomp2 (>= 2.5)")

	// A real sandbox: proves namespaces, a fresh /proc, pivot_root and
	// the cgroup all work here.
	l, err := launcher.New(launcher.Options{})
	if err != nil {
		check("profiles", false, err.Error(), "")
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	res, err := l.Run(ctx, launcher.Request{Profile: "restrictive", Argv: []string{"/bin/sh", "-c", "test -r /proc/self/status && echo ok"},
		Stdout: &out, Stderr: &errb})
	switch {
	case err != nil:
		check("sandbox (restrictive)", false, err.Error(), "see the step and hint above")
	case res.SetupError != nil:
		fix := res.SetupError.Hint
		check("sandbox (restrictive)", false, res.SetupError.Error(), fix)
		if res.SetupError.Action == "mount proc" {
			check("fresh /proc", false, "cannot mount procfs for a new pid namespace", fix)
		}
	default:
		check("sandbox (restrictive)", res.ExitCode == 0 && strings.TrimSpace(out.String()) == "ok",
			fmt.Sprintf("exit %d in %.1f ms, fresh /proc mounted", res.ExitCode, res.WallTimeMs), strings.TrimSpace(errb.String()))
	}
	if ok {
		fmt.Println("\nstr can run sandboxes on this host.")
		return 0
	}
	fmt.Println("\nsome checks failed: see the fixes above.")
	return 1
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func fieldOf(s, key string) string {
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			return v
		}
	}
	return ""
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}
