// Package pod_test reproduces the constraints of the Kubernetes pod of
// deploy/kubernetes/deployment.yaml with Docker and serves calls there: no
// cluster runs here, so each constraint of the manifest is read from it and
// turned into what reproduces it (podArgs refuses a constraint it does not
// know how to reproduce):
//
//	hostUsers: false               the worker runs as uid 0 of a user namespace
//	                               mapping 0-65535 to 100000-165535 (podns, as
//	                               the runtime does: 65,536 ids), with a mount
//	                               namespace owned by it
//	runAsUser: 0                   uid 0 inside that namespace
//	readOnlyRootFilesystem: true   docker run --read-only
//	volumes (emptyDir)             tmpfs at each mountPath, owned by the pod's
//	                               root (uid 100000, as the runtime's idmapped
//	                               volumes are), mode 0777 as the kubelet makes
//	                               them, sizeLimit as size: the only writable
//	                               paths
//	volumes (configMap, readOnly)  examples/tools bind-mounted read-only at /tools
//	capabilities add/drop          docker's default set less NET_RAW plus SYS_ADMIN,
//	                               and the same bounding set inside
//	                               the user namespace (setpriv in podinit.sh)
//	procMount: Unmasked            --security-opt systempaths=unconfined (Docker
//	                               otherwise masks /proc/kcore, /proc/keys, ...)
//	seccompProfile: Localhost      --security-opt seccomp=deploy/docker/seccomp.json
//	appArmorProfile: Unconfined    --security-opt apparmor=unconfined
//	env (literal values)           -e NAME=VALUE, STR_STATE_DIR and STR_ID_RANGE
//	                               among them (valueFrom entries name the Solace
//	                               broker and secrets: the test's worker uses its
//	                               embedded dev broker instead)
//	resources.limits.memory        --memory (limits.cpu is not reproduced: Docker
//	                               refuses more CPUs than the machine has)
//
// The container's cgroup is made writable and chowned to the pod's root
// before the user namespace is entered (podinit.sh), standing in for the
// runtime's delegation of a user-namespaced container's cgroup.
//
// TestPodServes serves echo_tool, a restrictive call and the escape attempts
// there; TestPodDoctor shows what the pod without the state volume or the
// id range gets: str doctor names both, with the fix.
package pod_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/securetoolruntime/str/test/internal/enginetest"
	"github.com/securetoolruntime/str/test/internal/strbuild"
)

// The helpers every engine test shares.
var (
	docker    = enginetest.Docker
	firstLine = enginetest.FirstLine
	repoRoot  = enginetest.RepoRoot
)

// need skips (or, with STR_MUST_WORK=1, fails) when the test cannot run
// here, naming what is missing (enginetest.Need).
func need(t *testing.T) (image, strBin string) {
	t.Helper()
	enginetest.Need(t, enginetest.Needs{Area: "pod", WhyRoot: "the container's root creates the pod's user namespace, and the test talks to the docker daemon", Bin: true})
	return os.Getenv("STR_IMAGE"), os.Getenv("STR_BIN")
}

// podRoot is the pod's uid 0 (and gid 0) on the node: the first id of its
// 65,536-id mapping.
const podRoot = 100000

// deployment is the part of the Deployment the test reproduces.
type deployment struct {
	Spec struct {
		Template struct {
			Spec struct {
				HostUsers  *bool       `yaml:"hostUsers"`
				Containers []container `yaml:"containers"`
				Volumes    []struct {
					Name     string `yaml:"name"`
					EmptyDir *struct {
						Medium    string `yaml:"medium"`
						SizeLimit string `yaml:"sizeLimit"`
					} `yaml:"emptyDir"`
					ConfigMap *struct{} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type container struct {
	Env []struct {
		Name      string     `yaml:"name"`
		Value     *string    `yaml:"value"`
		ValueFrom *yaml.Node `yaml:"valueFrom"`
	} `yaml:"env"`
	Resources struct {
		Limits map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext map[string]yaml.Node `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

func loadDeployment(t *testing.T, root string) (deployment, container) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy/kubernetes/deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var d deployment
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatalf("deployment.yaml: %v", err)
	}
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("deployment.yaml: %d containers, want 1", len(d.Spec.Template.Spec.Containers))
	}
	return d, d.Spec.Template.Spec.Containers[0]
}

// dockerDefaultCaps is the engine's default capability set (Docker's and
// containerd's are the same list).
var dockerDefaultCaps = []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
	"SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}

// capNumbers: the capabilities a manifest may add, by name.
var capNumbers = map[string]int{
	"CHOWN": unix.CAP_CHOWN, "DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "FSETID": unix.CAP_FSETID, "FOWNER": unix.CAP_FOWNER,
	"MKNOD": unix.CAP_MKNOD, "NET_RAW": unix.CAP_NET_RAW, "SETGID": unix.CAP_SETGID, "SETUID": unix.CAP_SETUID,
	"SETFCAP": unix.CAP_SETFCAP, "SETPCAP": unix.CAP_SETPCAP, "NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE,
	"SYS_CHROOT": unix.CAP_SYS_CHROOT, "KILL": unix.CAP_KILL, "AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
	"SYS_ADMIN": unix.CAP_SYS_ADMIN, "NET_ADMIN": unix.CAP_NET_ADMIN,
}

// manifestCaps is the container's capability set the manifest asks for,
// as /proc/PID/status prints a mask.
func manifestCaps(t *testing.T, root string) string {
	t.Helper()
	_, c := loadDeployment(t, root)
	var caps struct{ Add, Drop []string }
	if n := c.SecurityContext["capabilities"]; n.Decode(&caps) != nil {
		t.Fatal("deployment.yaml: capabilities")
	}
	var mask uint64
	for _, name := range dockerDefaultCaps {
		mask |= 1 << capNumbers[name]
	}
	for _, name := range caps.Drop {
		mask &^= 1 << capNumbers[name]
	}
	for _, name := range caps.Add {
		n, ok := capNumbers[name]
		if !ok {
			t.Fatalf("deployment.yaml adds capability %s: test/pod does not know it", name)
		}
		mask |= 1 << n
	}
	return fmt.Sprintf("%016x", mask)
}

// podArgs turns the manifest's constraints into docker run options.
// without names volumes to leave out (TestPodDoctor), or "procMount" for
// the runtime's default (masked) /proc; skipEnv names env variables to
// leave out.
func podArgs(t *testing.T, root, tools string, without, skipEnv []string) []string {
	t.Helper()
	d, c := loadDeployment(t, root)
	ps := d.Spec.Template.Spec
	var args []string
	fail := func(format string, a ...any) {
		t.Fatalf("deployment.yaml: "+format+": test/pod does not reproduce it", a...)
	}

	// The pod's user namespace: podinit.sh (the entrypoint) enters it.
	if ps.HostUsers == nil || *ps.HostUsers {
		fail("hostUsers is not false")
	}
	// securityContext, field by field.
	sc := c.SecurityContext
	scalar := func(k string) string { n := sc[k]; return n.Value }
	for k := range sc {
		switch k {
		case "privileged", "allowPrivilegeEscalation", "runAsUser", "runAsNonRoot", "readOnlyRootFilesystem",
			"procMount", "capabilities", "seccompProfile", "appArmorProfile":
		default:
			fail("securityContext.%s", k)
		}
	}
	if scalar("privileged") != "false" || scalar("runAsUser") != "0" || scalar("runAsNonRoot") != "false" {
		fail("privileged %q, runAsUser %q, runAsNonRoot %q (want false, 0, false)", scalar("privileged"), scalar("runAsUser"), scalar("runAsNonRoot"))
	}
	// allowPrivilegeEscalation: true is Docker's default (no
	// no-new-privileges); false would be --security-opt no-new-privileges.
	if scalar("allowPrivilegeEscalation") != "true" {
		fail("allowPrivilegeEscalation %q", scalar("allowPrivilegeEscalation"))
	}
	if scalar("readOnlyRootFilesystem") != "true" {
		fail("readOnlyRootFilesystem %q", scalar("readOnlyRootFilesystem"))
	}
	args = append(args, "--read-only")
	if scalar("procMount") != "Unmasked" {
		fail("procMount %q", scalar("procMount"))
	}
	if !contains(without, "procMount") {
		args = append(args, "--security-opt", "systempaths=unconfined")
	}
	var caps struct{ Add, Drop []string }
	if n := sc["capabilities"]; n.Decode(&caps) != nil {
		fail("capabilities")
	}
	set := map[string]bool{}
	for _, c := range dockerDefaultCaps {
		set[c] = true
	}
	for _, c := range caps.Drop {
		delete(set, c)
	}
	for _, c := range caps.Add {
		set[c] = true
	}
	args = append(args, "--cap-drop", "ALL")
	var inside []string
	for c := range set {
		args = append(args, "--cap-add", c)
		inside = append(inside, "+"+strings.ToLower(c))
	}
	args = append(args, "-e", "POD_CAPS=-all,"+strings.Join(inside, ","))
	var seccomp struct {
		Type             string `yaml:"type"`
		LocalhostProfile string `yaml:"localhostProfile"`
	}
	if n := sc["seccompProfile"]; n.Decode(&seccomp) != nil || seccomp.Type != "Localhost" || seccomp.LocalhostProfile != "str-worker.json" {
		fail("seccompProfile %+v (want Localhost str-worker.json, i.e. deploy/docker/seccomp.json)", seccomp)
	}
	args = append(args, "--security-opt", "seccomp="+filepath.Join(root, "deploy/docker/seccomp.json"))
	var apparmor struct{ Type string }
	if n := sc["appArmorProfile"]; n.Decode(&apparmor) != nil || apparmor.Type != "Unconfined" {
		fail("appArmorProfile %+v", apparmor)
	}
	args = append(args, "--security-opt", "apparmor=unconfined")

	// Volumes: the only writable paths.
	for _, vm := range c.VolumeMounts {
		if contains(without, vm.Name) {
			continue
		}
		found := false
		for _, v := range ps.Volumes {
			if v.Name != vm.Name {
				continue
			}
			found = true
			switch {
			case v.ConfigMap != nil && vm.ReadOnly && vm.MountPath == "/tools":
				args = append(args, "-v", tools+":/tools:ro")
			case v.EmptyDir != nil && !vm.ReadOnly:
				size := strings.TrimSuffix(strings.TrimSuffix(v.EmptyDir.SizeLimit, "i"), "B")
				// Mode 0777, as the kubelet makes an emptyDir.
				args = append(args, "--tmpfs", fmt.Sprintf("%s:rw,exec,uid=%d,gid=%d,mode=0777,size=%s", vm.MountPath, podRoot, podRoot, strings.ToLower(size)))
			default:
				fail("volume %s at %s", v.Name, vm.MountPath)
			}
		}
		if !found {
			fail("volumeMount %s without a volume", vm.Name)
		}
	}
	// Literal environment values.
	for _, e := range c.Env {
		if e.Value != nil && !contains(skipEnv, e.Name) {
			args = append(args, "-e", e.Name+"="+*e.Value)
		}
	}
	if m := c.Resources.Limits["memory"]; m != "" {
		args = append(args, "--memory", strings.ToLower(strings.TrimSuffix(m, "i")))
	}
	return args
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// podTools builds podns and returns the docker options that mount it and
// podinit.sh at /pod, str at /t/str, and the entrypoint.
func podTools(t *testing.T, root, strBin string) []string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "podns")
	build := exec.Command("go", "build", "-o", bin, "./test/pod/podns")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./test/pod/podns: %v\n%s", err, out)
	}
	return []string{"-v", bin + ":/pod/podns:ro", "-v", filepath.Join(root, "test/pod/podinit.sh") + ":/pod/podinit.sh:ro",
		"-v", strBin + ":/t/str:ro", "-v", strbuild.WorkerBeside(strBin) + ":/t/" + strbuild.Worker + ":ro",
		"-v", strbuild.EgressBeside(strBin) + ":/t/" + strbuild.Egress + ":ro", "--cgroupns", "private", "--entrypoint", "/pod/podinit.sh"}
}

// TestPodServes starts the worker in the reproduced pod and serves through
// its embedded broker (published on a loopback port): echo_tool, a
// restrictive call (execute_python) and the escape attempts; the id leases
// and cgroup locks are in the state volume; docker stop ends it cleanly.
func TestPodServes(t *testing.T) {
	image, strBin := need(t)
	root := repoRoot(t)
	name := fmt.Sprintf("strpod-serve-%d", os.Getpid())
	_ = exec.Command("docker", "rm", "-f", name).Run()
	args := append([]string{"run", "-d", "--name", name}, podArgs(t, root, filepath.Join(root, "examples/tools"), nil, nil)...)
	args = append(args, podTools(t, root, strBin)...)
	// The dev broker refuses a group- or world-writable directory for its
	// token (an emptyDir is 0777): a directory of its own in the volume.
	args = append(args, "-e", "SAM_NAMESPACE=pod/", "-e", "DEV_BROKER_TOKEN_FILE=/run/str/broker/broker.token", "-p", "127.0.0.1::55554",
		image, fmt.Sprint(podRoot), "/t/str", "worker", "--embedded-broker", "0.0.0.0:55554")
	t0 := time.Now()
	docker(t, args...)
	stopped := false
	t.Cleanup(func() {
		if !stopped || t.Failed() {
			out, _ := exec.Command("docker", "logs", "--tail", "40", name).CombinedOutput()
			t.Logf("worker log (last lines):\n%s", out)
		}
		_ = exec.Command("docker", "rm", "-f", name).Run()
	})

	// Ready: /readyz 200 (connected to its broker, past the start-up
	// probe sandbox).
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if st := docker(t, "inspect", "-f", "{{.State.Status}}", name); st != "running" {
			out, _ := exec.Command("docker", "logs", "--tail", "20", name).CombinedOutput()
			t.Fatalf("container %s while starting:\n%s", st, out)
		}
		out, err := exec.Command("docker", "exec", name, "python3", "-c",
			"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8081/readyz', timeout=5).status)").CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) == "200" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker not ready after 3 minutes: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("measured: worker ready %.1f s after docker run (start-up probe sandbox included)", time.Since(t0).Seconds())

	// The worker is uid 0 of a 65,536-id user namespace (seen from the
	// container's root: uid 100000, the pod's root on the node), with the
	// manifest's capabilities and nothing more (CapBnd: the engine's
	// default set less NET_RAW plus SYS_ADMIN). /t/str
	// worker execs /t/str-worker in the same process.
	st := docker(t, "exec", name, "sh", "-c",
		`for p in /proc/[0-9]*; do if [ "$(readlink $p/exe)" = /t/`+strbuild.Worker+` ]; then cat $p/uid_map $p/gid_map; grep -E '^(Uid|CapBnd):' $p/status; break; fi; done`)
	want := []string{fmt.Sprintf("0 %d 65536", podRoot), fmt.Sprintf("Uid: %d %d %d %d", podRoot, podRoot, podRoot, podRoot), "CapBnd:\t" + manifestCaps(t, root)}
	for _, w := range want {
		if !strings.Contains(strings.Join(strings.Fields(st), " "), strings.Join(strings.Fields(w), " ")) {
			t.Errorf("the worker's uid_map/gid_map/status lack %q:\n%s", w, st)
		}
	}

	// The token of the embedded broker, from the state volume.
	token := filepath.Join(t.TempDir(), "broker.token")
	if err := os.WriteFile(token, []byte(docker(t, "exec", name, "cat", "/run/str/broker/broker.token")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := firstLine([]byte(docker(t, "port", name, "55554/tcp")))
	invoke := func(tool string, extra ...string) (map[string]any, string) {
		t.Helper()
		return enginetest.Invoke(t, strBin, addr, token, "pod/", tool, extra...)
	}

	// 1. echo_tool (standard profile).
	res, raw := invoke("echo_tool", "--args", `{"message":"from the pod"}`)
	if tr, _ := res["tool_result"].(map[string]any); tr == nil || tr["echo"] != "from the pod" {
		t.Errorf("echo_tool: %s", raw)
	}
	t.Logf("measured: echo_tool execution_time_ms %v", res["execution_time_ms"])

	// 2. A restrictive call: its own network namespace, tight limits.
	res, raw = invoke("execute_python", "--args", `{"code":"import os\nresult = (6*7, os.getuid() != 0)"}`)
	if tr, _ := res["tool_result"].(map[string]any); tr == nil || tr["result"] != "(42, True)" {
		t.Errorf("execute_python (restrictive): want result (42, True): %s", raw)
	}
	t.Logf("measured: execute_python (restrictive) execution_time_ms %v", res["execution_time_ms"])

	// 3. The escape attempts, all blocked inside the pod too.
	res, raw = invoke("escape_attempt")
	if tr, _ := res["tool_result"].(map[string]any); tr == nil || tr["all_blocked"] != true {
		t.Errorf("escape_attempt in the pod: want all_blocked true: %s", raw)
	}

	// 4. The sandboxes leased their ids and locked their cgroups in the
	// state volume (STR_STATE_DIR=/run/str), the read-only root untouched.
	if out := docker(t, "exec", name, "sh", "-c", "ls /run/str/ids | wc -l; test -d /run/str/cgroups && echo cgroups"); !strings.HasSuffix(out, "cgroups") || strings.HasPrefix(out, "0") {
		t.Errorf("state directory /run/str: want id lease files and cgroups/: %q", out)
	}

	// 5. docker stop: SIGTERM through podns to the worker, which drains
	// and exits 0.
	docker(t, "stop", "-t", "120", name)
	stopped = true
	if code := docker(t, "inspect", "-f", "{{.State.ExitCode}} {{.State.OOMKilled}}", name); code != "0 false" {
		t.Errorf("after docker stop: exit code, OOM = %s, want 0 false", code)
	}
}

// TestPodDoctor: the pod as the old manifest had it (no state volume, no
// STR_ID_RANGE). str doctor names both, each with a fix that works (the
// range it prints is the manifest's); a sandbox fails at "lease host ids"
// (str run: exit 125) with an error naming the lease directory /run/str/ids,
// and the hint names the volume, not the id range. And with the runtime's
// masked /proc (procMount: Default), str doctor names procMount.
func TestPodDoctor(t *testing.T) {
	image, strBin := need(t)
	root := repoRoot(t)
	tools := podTools(t, root, strBin)
	run := func(env []string, cmd ...string) string {
		args := append([]string{"run", "--rm"}, podArgs(t, root, filepath.Join(root, "examples/tools"), []string{"state"}, []string{"STR_ID_RANGE"})...)
		args = append(args, tools...)
		for _, e := range env {
			args = append(args, "-e", e)
		}
		args = append(args, image, fmt.Sprint(podRoot))
		args = append(args, cmd...)
		out, _ := exec.Command("docker", args...).CombinedOutput()
		return string(out)
	}
	out := run(nil, "/t/str", "doctor")
	for _, want := range []string{
		"uid_map 0 100000 65536",
		"range 1879048192:65536 (default): ids 1879048192-1879113727 are not all inside this process's uid_map and gid_map (0 100000 65536)",
		"fix: STR_ID_RANGE=10002:55532 ",
		"state directory /run/str/cgroups (STR_STATE_DIR): mkdir /run/str: read-only file system",
		"id lease directory /run/str/ids (every root str of the host): mkdir /run/str: read-only file system",
		"an emptyDir mounted at /run/str",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("str doctor in the pod without the state volume and STR_ID_RANGE lacks %q:\n%s", want, out)
		}
	}
	_, c := loadDeployment(t, root)
	for _, e := range c.Env {
		if e.Name == "STR_ID_RANGE" && (e.Value == nil || !strings.Contains(out, "fix: STR_ID_RANGE="+*e.Value+" ")) {
			t.Errorf("the manifest's STR_ID_RANGE is not the one str doctor suggests")
		}
	}

	// With the id range but without the state volume: rc 125 and the
	// hint names the state directory.
	out = run([]string{"STR_ID_RANGE=10002:55532"}, "/bin/sh", "-c", "/t/str run --profile restrictive -- /bin/true; echo rc=$?")
	for _, want := range []string{"lease host ids", "id lease directory /run/str/ids (every root str of the host): mkdir /run/str: read-only file system", "emptyDir mounted at /run/str", "rc=125"} {
		if !strings.Contains(out, want) {
			t.Errorf("str run in the pod without the state volume lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "set STR_ID_RANGE") {
		t.Errorf("str run's hint names the id range for an unwritable state directory:\n%s", out)
	}

	// procMount: Default (the runtime masks /proc/kcore, /proc/keys, ...):
	// str doctor names the setting that unmasks it.
	args := append([]string{"run", "--rm"}, podArgs(t, root, filepath.Join(root, "examples/tools"), []string{"procMount"}, nil)...)
	args = append(args, tools...)
	args = append(args, image, fmt.Sprint(podRoot), "/t/str", "doctor")
	b, _ := exec.Command("docker", args...).CombinedOutput()
	for _, want := range []string{"[FAIL] fresh /proc", "the container runtime's masked paths", "securityContext.procMount: Unmasked"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("str doctor in the pod with a masked /proc lacks %q:\n%s", want, b)
		}
	}
}
