package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/procfs"
	"github.com/securetoolruntime/str/launcher/resident"
	"github.com/securetoolruntime/str/launcher/statedir"
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
	// warn: sandboxes run, with less than the profile asks (said, not failed).
	warn := func(name, detail, fix string) {
		fmt.Printf("[warn] %-28s %s\n", name, detail)
		if fix != "" {
			fmt.Printf("       fix: %s\n", fix)
		}
	}

	var uts unix.Utsname
	_ = unix.Uname(&uts)
	info("kernel", unix.ByteSliceToString(uts.Release[:]))
	uid := os.Geteuid()
	runMode := map[bool]string{true: "root mode", false: "rootless mode"}[procfs.RootMode()]
	if uid == 0 && !procfs.RootMode() {
		runMode += ": uid 0 of a user namespace that maps one id (a sandbox's), no host ids to lease"
	}
	info("running as", fmt.Sprintf("uid %d (%s)", uid, runMode))
	// The worker is a program of its own: str run works without it, so
	// its absence is information, not a failure.
	if path, err := workerPath("str worker"); err != nil {
		info("worker program", "str worker, broker, invoke and tools cannot start: "+err.Error())
	} else {
		info("worker program", path+" (str worker, broker, invoke and tools exec it)")
	}
	doctorResident(info)
	info("runtime classes", runtimesSummary())
	engine := containerEngine()
	if engine != "" {
		info("container", engine+" (the engine's settings below are docs/deployment.md's \"Docker\")")
		// Root in a container without CAP_SYS_ADMIN cannot create the
		// sandbox's namespaces nor mount anything (Docker drops it).
		if capEff, err := strconv.ParseUint(strings.TrimSpace(fieldOf(readFile("/proc/self/status"), "CapEff:")), 16, 64); err == nil && uid == 0 {
			has := capEff&(1<<unix.CAP_SYS_ADMIN) != 0
			check("container capabilities", has, map[bool]string{true: "CAP_SYS_ADMIN present", false: "no CAP_SYS_ADMIN"}[has],
				"docker run --cap-add SYS_ADMIN (the sandbox's namespaces and mounts; --privileged is not needed)")
		}
	}

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
		cgs, _ := procfs.Cgroups("self")
		st := probeCgroupDirs(2, map[string]string{"": cgs[""]})
		detail, fix := cgroupAdvice(st, uid, engine)
		check("cgroup delegation", st.writable(), detail, fix)
	case launcher.CgroupV1:
		check("cgroup", true, "v1 controllers (hybrid/legacy): memory, pids, cpu via the v1 fallback; cgroup.kill emulated with freezer", "")
	default:
		// No cgroup this user may write (launcher.DetectCgroup): v2 not
		// delegated, or the v1 memory or pids cgroup not writable. Say
		// which, and why. Unprivileged, str runs without the limits and
		// says so (unless STR_REQUIRE_CGROUP=1); root fails.
		cgs, _ := procfs.Cgroups("self")
		st := probeCgroupDirs(1, map[string]string{"memory": cgs["memory"], "pids": cgs["pids"]})
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
			st = probeCgroupDirs(2, map[string]string{"": cgs[""]})
		}
		detail, fix := cgroupAdvice(st, uid, engine)
		if uid != 0 && os.Getenv("STR_REQUIRE_CGROUP") != "1" {
			warn("cgroup", detail+fmt.Sprintf(": limits not enforced for uid %d (str run and str bwrap run without memory.max, cpu.max, pids.max; the rlimits and the timeout still hold)", uid),
				fix+"; STR_REQUIRE_CGROUP=1 refuses to run without them")
		} else {
			check("cgroup", false, detail, fix)
		}
	}

	// Spawn latency: no sandbox start migrates a process between cgroups
	// (v2: CLONE_INTO_CGROUP; v1: the init's exec thread moves itself,
	// which takes no global lock), so favordynmods is not needed.

	// Host ids and the state directory: every sandbox runs under a block
	// of host ids of its own, leased in launcher.IDLeaseDir.
	doctorIDRange(check, info, uid)
	doctorStateDir(check)

	// A covered /proc (container runtimes mount over /proc/kcore, systemd's
	// ProtectKernelLogs over /proc/kmsg, ...) forbids mounting a fresh
	// /proc inside a user namespace: doctor_proc.go.
	procFix := checkProcCovered(check, info, engine)

	// seccomp: the filters are generated in pure Go (seccomp/), so no
	// libseccomp is needed at run time; only the kernel's support is checked.
	seccompMode := strings.TrimSpace(fieldOf(readFile("/proc/self/status"), "Seccomp:"))
	check("seccomp", readFile("/proc/sys/kernel/seccomp/actions_avail") != "",
		"actions: "+strings.TrimSpace(readFile("/proc/sys/kernel/seccomp/actions_avail"))+"; this process Seccomp="+seccompMode,
		"a kernel with CONFIG_SECCOMP_FILTER")

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
		if call := refusedMountCall(res.SetupError.Error()); engine != "" && seccompMode == "2" && call != "" {
			check("container seccomp profile", false, "the container's seccomp filter refuses "+call+" (Docker's default profile lacks it)",
				"docker run --security-opt seccomp=deploy/docker/seccomp.json (Docker's default plus the namespace and mount calls str makes, each with its reason)")
		}
		if res.SetupError.Action == "mount proc" {
			if procFix != "" {
				fix = procFix
			}
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

// doctorResident says whether a plain str run here is served by a
// resident launcher: what listens where str run looks by itself
// ($STR_SERVE_SOCKET, else the state directory's serve.sock). Either way
// sandboxes work, so it is information.
func doctorResident(info func(name, detail string)) {
	sock := resident.ImplicitSocket()
	if sock == "" {
		info("resident launcher", "none ($STR_SERVE_SOCKET is empty): str run is one-shot")
		return
	}
	pid, uid, err := resident.Listener(sock)
	switch {
	case err != nil:
		info("resident launcher", "none on "+sock+": str run is one-shot (systemctl enable --now str-serve: pre-built sandboxes)")
	case uid != 0:
		info("resident launcher", fmt.Sprintf("%s is listened on by uid %d (pid %d), not root: not a str serve; str run will not use it", sock, uid, pid))
	default:
		info("resident launcher", fmt.Sprintf("str serve (pid %d) on %s: str run's poolable requests are served by it", pid, sock))
	}
}

// doctorIDRange checks the root-mode id range against this process's id
// maps and, when it does not fit (a pod's user namespace: 65,536 ids),
// prints one that does.
func doctorIDRange(check func(name string, good bool, detail, fix string), info func(name, detail string), uid int) {
	if !procfs.RootMode() {
		info("sandbox host ids", fmt.Sprintf("rootless: every sandbox runs as uid %d (the only id this user can map)", uid))
		return
	}
	space, err := launcher.ReadIDSpace()
	if err != nil {
		check("sandbox host ids", false, err.Error(), "")
		return
	}
	if !launcher.FullIdentityMap(space) {
		info("id maps", fmt.Sprintf("user namespace: uid_map %s; gid_map %s", launcher.FormatIDMap(space.UIDMap), launcher.FormatIDMap(space.GIDMap)))
	}
	r, err := launcher.LoadIDRange(os.Getenv, "/etc/subuid", space)
	if err != nil {
		fix := "no range fits this process's id maps: give the worker's user namespace more ids (at least 1000-1001 mapped)"
		if s, ok := suggestIDRange(space); ok {
			fix = fmt.Sprintf("STR_ID_RANGE=%d:%d (ids %d-%d: inside this process's id maps, clear of root, the system accounts, the accounts of /etc/passwd and /etc/group, the worker's and the overflow ids; %d concurrent sandboxes)",
				s.Start, s.Count, s.Start, s.Start+s.Count-1, s.Slots())
		}
		check("sandbox host ids", false, err.Error(), fix)
		return
	}
	clash := accountsInRange(readFile("/etc/passwd"), r)
	check("sandbox host ids", len(clash) == 0,
		fmt.Sprintf("range %s: %d concurrent sandboxes, %d ids each (the init, the tool)", r, r.Slots(), launcher.IDsPerSandbox)+
			map[bool]string{true: "", false: "; accounts inside the range: " + strings.Join(clash, ", ")}[len(clash) == 0],
		"pick a range no account uses: STR_ID_RANGE=START:COUNT or a str:START:COUNT line in /etc/subuid")
}

// suggestIDRange is the largest range (an even count: whole sandboxes)
// inside both of space's maps and clear of every reserved id
// (IDSpace.Reserved); ok is false when there is none.
func suggestIDRange(space launcher.IDSpace) (r launcher.IDRange, ok bool) {
	type run struct{ first, last int }
	// 1. the ids both maps hold.
	var runs []run
	for _, u := range space.UIDMap {
		for _, g := range space.GIDMap {
			first, last := max(u.Inside, g.Inside), min(u.Inside+u.Size, g.Inside+g.Size)-1
			if first <= last {
				runs = append(runs, run{first, min(last, launcher.MaxID)})
			}
		}
	}
	slices.SortFunc(runs, func(a, b run) int { return a.first - b.first })
	var merged []run
	for _, x := range runs {
		if n := len(merged); n > 0 && x.first <= merged[n-1].last+1 {
			merged[n-1].last = max(merged[n-1].last, x.last)
			continue
		}
		merged = append(merged, x)
	}
	runs = merged
	// 2. less the reserved ids.
	for _, res := range space.Reserved() {
		var next []run
		for _, x := range runs {
			if res.Last < x.first || res.First > x.last {
				next = append(next, x)
				continue
			}
			if x.first < res.First {
				next = append(next, run{x.first, res.First - 1})
			}
			if res.Last < x.last {
				next = append(next, run{res.Last + 1, x.last})
			}
		}
		runs = next
	}
	// 3. the longest, cut to whole sandboxes.
	for _, x := range runs {
		if n := (x.last - x.first + 1) &^ (launcher.IDsPerSandbox - 1); n >= launcher.IDsPerSandbox && n > r.Count {
			r = launcher.IDRange{Start: x.first, Count: n, Source: "str doctor"}
		}
	}
	return r, r.Count > 0
}

// doctorStateDir checks that the state directory (cgroup locks) and, as
// root, the host's id lease directory can be created and written.
func doctorStateDir(check func(name string, good bool, detail, fix string)) {
	if err := statedir.Check(os.Getenv); err != nil {
		check("state directory", false, err.Error(), "set "+statedir.Env+" to an absolute path")
		return
	}
	dir := statedir.Dir(os.Getenv)
	sub, err := statedir.Sub(dir, "cgroups")
	if err == nil {
		if err = unix.Access(sub, unix.W_OK); err != nil {
			err = &statedir.Error{Dir: sub, Err: err}
		}
	}
	if err != nil {
		check("state directory", false, err.Error(), statedir.HintFor(dir, err))
	} else {
		check("state directory", true, dir+" is writable ("+statedir.Env+")", "")
	}
	if !procfs.RootMode() {
		return // rootless sandboxes lease no host ids
	}
	err = os.MkdirAll(launcher.IDLeaseDir, 0o700)
	if err == nil {
		err = unix.Access(launcher.IDLeaseDir, unix.W_OK)
	}
	if err != nil {
		check("id leases", false, (&launcher.IDLeaseError{Dir: launcher.IDLeaseDir, Err: err}).Error(), launcher.IDLeaseHint())
		return
	}
	check("id leases", true, launcher.IDLeaseDir+" is writable (one for every root str of the host)", "")
}

// containerEngine names the container engine this process runs under, from
// the files the engines leave in the container's root; "" outside one.
func containerEngine() string {
	for _, f := range [][2]string{{"/.dockerenv", "docker"}, {"/run/.containerenv", "podman"}} {
		if _, err := os.Stat(f[0]); err == nil {
			return f[1] + " (" + f[0] + ")"
		}
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return "kubernetes (KUBERNETES_SERVICE_HOST)"
	}
	return ""
}

// cgroupDir is one cgroup directory str needs to write: its own cgroup
// (v2), or its own cgroup in one v1 controller.
type cgroupDir struct {
	controller string // "" on v2
	path       string // under /sys/fs/cgroup
	missing    bool   // the controller is not mounted (v1) or the path is absent
	readOnly   bool   // the mount holding it is read-only
	writable   bool   // access(W_OK) for this process
}

// cgroupState is what str doctor found of the cgroup hierarchy.
type cgroupState struct {
	version int // 1 (hybrid/legacy) or 2 (unified)
	dirs    []cgroupDir
}

func (st cgroupState) writable() bool {
	for _, d := range st.dirs {
		if !d.writable {
			return false
		}
	}
	return true
}

// probeCgroupDirs looks at this process's own cgroup directories (own:
// controller -> path, "" on v2), in a stable order.
func probeCgroupDirs(version int, own map[string]string) cgroupState {
	st := cgroupState{version: version}
	for _, c := range slices.Sorted(maps.Keys(own)) {
		dir := filepath.Join("/sys/fs/cgroup", c, own[c])
		d := cgroupDir{controller: c, path: dir}
		var fs unix.Statfs_t
		if own[c] == "" && version == 1 || unix.Statfs(dir, &fs) != nil {
			d.missing = true
		} else {
			d.readOnly = fs.Flags&unix.ST_RDONLY != 0
			d.writable = unix.Access(dir, unix.W_OK) == nil
		}
		st.dirs = append(st.dirs, d)
	}
	return st
}

// cgroupAdvice is the detail and the fix for a cgroup hierarchy str
// cannot write, for the cause found: a read-only mount (a container
// engine's, or the host's), or a directory this user does not own (no
// delegation), each said for the hierarchy there is (v1 has no
// Delegate=yes). detail is empty of blame when everything is writable.
func cgroupAdvice(st cgroupState, uid int, engine string) (detail, fix string) {
	var ro, denied, missing []string
	for _, d := range st.dirs {
		switch {
		case d.missing:
			missing = append(missing, d.path)
		case d.readOnly:
			ro = append(ro, d.path)
		case !d.writable:
			denied = append(denied, d.path)
		}
	}
	list := func(ps []string) string { return strings.Join(ps, ", ") }
	switch {
	case len(ro)+len(denied)+len(missing) == 0:
		if st.version == 2 {
			return "own cgroup " + st.dirs[0].path + " is writable", ""
		}
		return "own memory and pids cgroups are writable", ""
	case len(missing) > 0:
		return fmt.Sprintf("cgroup v%d: %s not found", st.version, list(missing)),
			"mount the memory and pids controllers (cgroup v1) or the unified hierarchy (v2), or use a best_effort profile (no memory/pids/cpu limits)"
	case len(ro) > 0 && engine != "":
		mount := "/sys/fs/cgroup"
		if st.version == 1 {
			mount = "the memory, pids, cpu, cpuacct and freezer bind mounts"
		}
		return fmt.Sprintf("cgroup v%d: %s on a read-only mount (the container's cgroup)", st.version, list(ro)),
			"the container's cgroup is mounted read-only (Docker does so unless --privileged): run it with --cgroupns=private and " +
				"remount " + mount + " read-write before the worker starts (the image's entrypoint str-container-worker does; needs CAP_SYS_ADMIN and the mount syscall)"
	case len(ro) > 0:
		return fmt.Sprintf("cgroup v%d: %s on a read-only mount", st.version, list(ro)),
			"remount the cgroup filesystem read-write (mount -o remount,rw), or use a best_effort profile (no memory/pids/cpu limits)"
	case uid == 0:
		return fmt.Sprintf("cgroup v%d: %s not writable by root (read-write mount: an LSM or the directory's mode refuses)", st.version, list(denied)),
			"let root write its own cgroup (check the directory's mode and any AppArmor/SELinux denial in the kernel log), or use a best_effort profile (no memory/pids/cpu limits)"
	case st.version == 2:
		fix = "delegate the subtree to uid " + strconv.Itoa(uid) + ": run under systemd with Delegate=yes (deploy/systemd/str-worker.service; " +
			"systemd-run --user --scope -p Delegate=yes for a shell), or chown the directory and its cgroup.procs, cgroup.subtree_control and cgroup.threads to this user; or run as root"
		if engine != "" {
			fix += "; in the image, the entrypoint delegates the container's cgroup (docker run --user 0 -e STR_RUN_AS=USER)"
		}
		return fmt.Sprintf("cgroup v2: own cgroup %s is not delegated to uid %d (not writable; the mount is read-write)", list(denied), uid), fix
	default:
		fix = "cgroup v1 has no Delegate=yes: chown these directories and their cgroup.procs and tasks to uid " + strconv.Itoa(uid) +
			" (as root), run as root, or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1) and delegate with Delegate=yes; " +
			"or use a best_effort profile (no memory/pids/cpu limits)"
		if engine != "" {
			fix = "the container's cgroup is not delegated to uid " + strconv.Itoa(uid) + ": start the image's entrypoint as root with STR_RUN_AS=USER " +
				"(docker run --user 0 -e STR_RUN_AS=str), which chowns the container's cgroups to USER and drops to it. Otherwise: " + fix
		}
		return fmt.Sprintf("cgroup v1: own cgroups %s are not writable by uid %d (not delegated; the mounts are read-write)", list(denied), uid), fix
	}
}

// refusedMountCall returns the mount-family call a sandbox setup error
// says was refused with EPERM, or "".
func refusedMountCall(msg string) string {
	if !strings.Contains(msg, "operation not permitted") {
		return ""
	}
	for _, c := range []string{"pivot_root", "open_tree", "move_mount", "mount_setattr"} {
		if strings.Contains(msg, c) {
			return c
		}
	}
	return ""
}

// accountsInRange lists the /etc/passwd accounts whose uid is in r.
func accountsInRange(passwd string, r launcher.IDRange) []string {
	var out []string
	for _, l := range strings.Split(passwd, "\n") {
		f := strings.Split(l, ":")
		if len(f) < 3 {
			continue
		}
		var id int
		if _, err := fmt.Sscan(f[2], &id); err == nil && id >= r.Start && id < r.Start+r.Count {
			out = append(out, f[0]+"="+f[2])
		}
	}
	return out
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
