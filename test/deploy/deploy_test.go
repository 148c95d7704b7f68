// Package deploy_test checks the deployment files by parsing them: the
// Dockerfile (built and run by test/container; here its shape), the Kubernetes manifests and the systemd unit.
package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// root is the repository root (this file is test/deploy/deploy_test.go).
func root(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller failed")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ---- Dockerfile ------------------------------------------------------------

type instruction struct {
	line int
	cmd  string // upper case
	args string // continuation lines joined
}

type stage struct {
	name, base string
	ins        []instruction
}

// parseDockerfile splits a Dockerfile into instructions (comments dropped,
// backslash continuations joined) grouped by stage.
func parseDockerfile(t *testing.T, text string) []stage {
	t.Helper()
	var stages []stage
	var cur strings.Builder
	start := 0
	flush := func() {
		s := strings.TrimSpace(cur.String())
		cur.Reset()
		if s == "" {
			return
		}
		cmd, args, _ := strings.Cut(s, " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			} else if len(f) != 1 {
				t.Fatalf("Dockerfile:%d: FROM %q: want IMAGE [AS NAME]", start, in.args)
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("Dockerfile:%d: %s before the first FROM", start, in.cmd)
			}
			return
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	for i, raw := range strings.Split(text, "\n") {
		line := strings.TrimSpace(raw)
		if cur.Len() == 0 {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			start = i + 1
		} else if strings.HasPrefix(line, "#") {
			continue // comment inside a continuation
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	if cur.Len() != 0 {
		t.Fatal("Dockerfile ends inside a continuation")
	}
	return stages
}

// execForm decodes the JSON (exec) form of ENTRYPOINT/CMD/HEALTHCHECK CMD.
func execForm(t *testing.T, in instruction, s string) []string {
	t.Helper()
	var argv []string
	if err := json.Unmarshal([]byte(s), &argv); err != nil {
		t.Fatalf("Dockerfile:%d: %s must use the JSON exec form (so that no shell runs as PID 1): %v", in.line, in.cmd, err)
	}
	return argv
}

func find(st stage, cmd string) []instruction {
	var out []instruction
	for _, in := range st.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func TestDockerfile(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(root(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(t, string(text))
	if len(stages) != 1 {
		t.Fatalf("%d stages, want 1 (runtime: the host-built str on a Debian 12 base; make image)", len(stages))
	}
	rt := stages[0]

	// 1. One stage FROM the BASE build-arg (make image passes the local
	// debootstrap base; a registry's debian:bookworm-slim works too).
	if rt.name != "runtime" || rt.base != "${BASE}" {
		t.Errorf("stage: FROM %s AS %s, want ${BASE} AS runtime", rt.base, rt.name)
	}
	if !regexp.MustCompile(`(?m)^ARG BASE=str-base:bookworm$`).Match(text) {
		t.Error("Dockerfile must declare ARG BASE=str-base:bookworm before FROM (scripts/image.sh tags the local base so)")
	}
	// 2. The run-time packages, installed when the base lacks them.
	var run strings.Builder
	for _, in := range find(rt, "RUN") {
		run.WriteString(in.args + "\n")
	}
	pkgs := regexp.MustCompile(`pkgs="([^"]*)"`).FindStringSubmatch(run.String())
	if pkgs == nil || !strings.Contains(run.String(), "apt-get install -y --no-install-recommends $pkgs") {
		t.Fatalf("the stage must apt-get install $pkgs (pkgs=\"...\") when the base lacks them; RUN lines:\n%s", run.String())
	}
	for _, p := range []string{"python3", "libssl3", "ca-certificates"} {
		if !slices.Contains(strings.Fields(pkgs[1]), p) {
			t.Errorf("run-time packages %q lack %s", pkgs[1], p)
		}
	}
	// The host-built binaries, side by side: `str worker` (the ENTRYPOINT
	// below) execs str-worker, and every launcher str-egress, from str's
	// own directory.
	for _, want := range []string{"${STR_BIN} /usr/local/bin/str", "${STR_WORKER_BIN} /usr/local/bin/str-worker", "${STR_EGRESS_BIN} /usr/local/bin/str-egress"} {
		copied := false
		for _, in := range find(rt, "COPY") {
			if in.args == want {
				copied = true
			}
		}
		if !copied {
			t.Errorf("the stage must COPY %s (a host-built binary)", want)
		}
	}

	// 3. str worker as PID 1, exec form.
	eps := find(rt, "ENTRYPOINT")
	if len(eps) != 1 {
		t.Fatalf("runtime stage has %d ENTRYPOINT, want 1", len(eps))
	}
	if argv := execForm(t, eps[0], eps[0].args); !slices.Equal(argv, []string{"/usr/local/bin/str", "worker"}) {
		t.Errorf("ENTRYPOINT %v, want [/usr/local/bin/str worker]", argv)
	}
	for _, in := range find(rt, "CMD") {
		execForm(t, in, in.args)
	}

	// 4. health check on /healthz of the health port, exec form.
	hcs := find(rt, "HEALTHCHECK")
	if len(hcs) != 1 {
		t.Fatalf("runtime stage has %d HEALTHCHECK, want 1", len(hcs))
	}
	_, cmd, ok := strings.Cut(hcs[0].args, "CMD ")
	if !ok {
		t.Fatalf("HEALTHCHECK %q has no CMD", hcs[0].args)
	}
	argv := execForm(t, hcs[0], cmd)
	if len(argv) != 3 || argv[0] != "python3" || argv[1] != "-c" || !strings.Contains(argv[2], "HEALTH_PORT") || !strings.Contains(argv[2], "/healthz") {
		t.Errorf("HEALTHCHECK CMD %v: want python3 -c fetching /healthz on $HEALTH_PORT", argv)
	} else {
		checkHealthcheck(t, argv)
	}
	exposed := false
	for _, in := range find(rt, "EXPOSE") {
		exposed = exposed || slices.Contains(strings.Fields(in.args), "8081")
	}
	if !exposed {
		t.Error("runtime stage does not EXPOSE 8081")
	}

	// 5. the non-root option.
	if users := find(rt, "USER"); len(users) != 1 || users[0].args != "${STR_USER}" {
		t.Errorf("runtime stage USER = %v, want one USER ${STR_USER} (build-arg for the non-root option)", users)
	}
	if !strings.Contains(run.String(), "useradd") {
		t.Error("runtime stage creates no non-root user")
	}
}

// TestDockerfileParser: continuations, comments inside them, stage names,
// and the exec form that the checks rely on.
func TestDockerfileParser(t *testing.T) {
	st := parseDockerfile(t, "ARG X=1\nFROM a AS b\n# c\nRUN x \\\n  # inner\n  y\nENTRYPOINT [\"/bin/x\"]\n")
	if len(st) != 1 || st[0].name != "b" || len(st[0].ins) != 2 || st[0].ins[0].args != "x  y" {
		t.Fatalf("parsed %+v", st)
	}
	var argv []string
	if err := json.Unmarshal([]byte("/bin/x worker"), &argv); err == nil {
		t.Fatal("shell form decoded as exec form")
	}
}

// ---- Kubernetes --------------------------------------------------------

// manifests decodes every document of every YAML file in deploy/kubernetes.
func manifests(t *testing.T) map[string][]map[string]any {
	t.Helper()
	dir := filepath.Join(root(t), "deploy", "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML in %s: %v", dir, err)
	}
	byKind := map[string][]map[string]any{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for i := 0; ; i++ {
			var doc map[string]any
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s document %d: %v", filepath.Base(f), i, err)
			}
			if doc == nil {
				continue
			}
			kind, _ := doc["kind"].(string)
			if kind == "" || doc["apiVersion"] == nil {
				t.Fatalf("%s document %d: no kind or apiVersion", filepath.Base(f), i)
			}
			byKind[kind] = append(byKind[kind], doc)
		}
	}
	return byKind
}

// get walks a decoded YAML tree: strings index maps, ints index lists.
func get(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %q: not a map (path %v)", k, path)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at [%d]: not a list long enough (path %v)", k, path)
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string { s, _ := v.(string); return s }

func TestKubernetes(t *testing.T) {
	m := manifests(t)
	deps := m["Deployment"]
	if len(deps) != 1 {
		t.Fatalf("%d Deployments, want 1", len(deps))
	}
	d := deps[0]
	name := str(get(t, d, "metadata", "name"))
	spec := get(t, d, "spec", "template", "spec")

	// 1. user namespaces; no privileged container.
	if get(t, spec, "hostUsers") != false {
		t.Errorf("pod spec hostUsers = %v, want false", get(t, spec, "hostUsers"))
	}
	if get(t, spec, "hostPID") == true || get(t, spec, "hostNetwork") == true || get(t, spec, "hostIPC") == true {
		t.Error("pod shares a host namespace")
	}
	containers, _ := get(t, spec, "containers").([]any)
	if len(containers) != 1 {
		t.Fatalf("%d containers, want 1", len(containers))
	}
	c := containers[0]
	sc := get(t, c, "securityContext")
	if str(get(t, sc, "procMount")) != "Unmasked" {
		t.Errorf("procMount = %v, want Unmasked", get(t, sc, "procMount"))
	}
	if get(t, sc, "privileged") != false {
		t.Errorf("privileged = %v, want an explicit false", get(t, sc, "privileged"))
	}
	if add, _ := get(t, sc, "capabilities", "add").([]any); len(add) > 0 {
		for _, capability := range add {
			if str(capability) != "SYS_ADMIN" {
				t.Errorf("capability %v added: only SYS_ADMIN is justified (not NET_ADMIN: the Docker deployment serves without it, test/container)", capability)
			}
		}
	}
	if st := str(get(t, sc, "seccompProfile", "type")); st != "Unconfined" && st != "Localhost" {
		t.Errorf("seccompProfile.type = %q, want Unconfined or Localhost", st)
	}

	// 2. probes on the health port's paths.
	port := -1
	for _, p := range get(t, c, "ports").([]any) {
		if str(get(t, p, "name")) == "health" {
			port = get(t, p, "containerPort").(int)
		}
	}
	if port != 8081 {
		t.Errorf("container port named health = %d, want 8081", port)
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		hg := get(t, c, probe, "httpGet")
		if str(get(t, hg, "path")) != path {
			t.Errorf("%s path = %v, want %s", probe, get(t, hg, "path"), path)
		}
		if p := get(t, hg, "port"); p != "health" && p != 8081 {
			t.Errorf("%s port = %v, want health or 8081", probe, p)
		}
	}

	// 3. environment: Solace password from a Secret, sandbox concurrency.
	env := map[string]any{}
	for _, e := range get(t, c, "env").([]any) {
		env[str(get(t, e, "name"))] = e
	}
	// The Solace password and the metrics token from example Secrets;
	// /metrics on a listener of its own, not the health port the kubelet
	// reaches (issue 16 §6).
	for _, name := range []string{"SOLACE_PASSWORD", "METRICS_TOKEN"} {
		secretName := ""
		if e, ok := env[name]; !ok {
			t.Errorf("%s not set", name)
			continue
		} else if get(t, e, "value") != nil {
			t.Errorf("%s has a literal value; it must come from a Secret", name)
		} else if secretName = str(get(t, e, "valueFrom", "secretKeyRef", "name")); secretName == "" {
			t.Errorf("%s does not come from a secretKeyRef", name)
		}
		found := false
		for _, s := range m["Secret"] {
			found = found || str(get(t, s, "metadata", "name")) == secretName
		}
		if !found {
			t.Errorf("%s: no example Secret named %q", name, secretName)
		}
	}
	if e, ok := env["METRICS_ADDR"]; !ok || strings.HasSuffix(str(get(t, e, "value")), ":8081") {
		t.Error("METRICS_ADDR unset or on the health port: /metrics must have a listener of its own")
	}
	if e, ok := env["SANDBOX_MAX_CONCURRENT"]; !ok || str(get(t, e, "value")) != "4" {
		t.Error("SANDBOX_MAX_CONCURRENT is not 4 (the resources are sized for 4)")
	}

	// 4. resources sized for 4 standard sandboxes (1 GiB, 2 CPUs each).
	res := get(t, c, "resources")
	for _, kind := range []string{"requests", "limits"} {
		if mem := mebibytes(t, str(get(t, res, kind, "memory"))); mem < 4*1024 {
			t.Errorf("%s.memory = %d MiB, want at least 4 x 1 GiB", kind, mem)
		}
	}
	if cpu := str(get(t, res, "limits", "cpu")); cpu != "8" {
		t.Errorf("limits.cpu = %q, want 8 (4 sandboxes x 2 CPUs)", cpu)
	}

	// 5. tools and manifest from a ConfigMap volume at /tools.
	cmName := ""
	var toolsVolume any
	for _, v := range get(t, spec, "volumes").([]any) {
		if str(get(t, v, "name")) == "tools" {
			cmName = str(get(t, v, "configMap", "name"))
			toolsVolume = v
		}
	}
	if cmName == "" {
		t.Fatal("no volume named tools from a ConfigMap")
	}
	mounted := false
	for _, vm := range get(t, c, "volumeMounts").([]any) {
		if str(get(t, vm, "name")) == "tools" && str(get(t, vm, "mountPath")) == "/tools" && get(t, vm, "readOnly") == true {
			mounted = true
		}
	}
	if !mounted {
		t.Error("the tools volume is not mounted read-only at /tools")
	}
	var tools map[string]any
	for _, cm := range m["ConfigMap"] {
		if str(get(t, cm, "metadata", "name")) == cmName {
			tools = cm
		}
	}
	if tools == nil {
		t.Fatalf("no ConfigMap named %q", cmName)
	}
	var manifest struct {
		Version int                       `yaml:"version"`
		Tools   map[string]map[string]any `yaml:"tools"`
	}
	if err := yaml.Unmarshal([]byte(str(get(t, tools, "data", "manifest.yaml"))), &manifest); err != nil || manifest.Version != 1 || len(manifest.Tools) == 0 {
		t.Errorf("ConfigMap %s manifest.yaml: version %d, %d tools, err %v", cmName, manifest.Version, len(manifest.Tools), err)
	}
	items, _ := get(t, toolsVolume, "configMap", "items").([]any)
	for _, item := range items {
		if get(t, tools, "data", str(get(t, item, "key"))) == nil {
			t.Errorf("tools volume item %v is not a key of ConfigMap %s", get(t, item, "key"), cmName)
		}
	}

	// 6. the HPA scales this Deployment.
	hpas := m["HorizontalPodAutoscaler"]
	if len(hpas) != 1 {
		t.Fatalf("%d HorizontalPodAutoscalers, want 1", len(hpas))
	}
	h := hpas[0]
	if str(get(t, h, "apiVersion")) != "autoscaling/v2" {
		t.Errorf("HPA apiVersion %v", get(t, h, "apiVersion"))
	}
	ref := get(t, h, "spec", "scaleTargetRef")
	if str(get(t, ref, "kind")) != "Deployment" || str(get(t, ref, "name")) != name || str(get(t, ref, "apiVersion")) != "apps/v1" {
		t.Errorf("HPA targets %v, want apps/v1 Deployment %s", ref, name)
	}
}

// mebibytes converts a Kubernetes memory quantity with Mi or Gi.
func mebibytes(t *testing.T, q string) int {
	t.Helper()
	var n int
	var unit string
	for i, r := range q {
		if r < '0' || r > '9' {
			unit = q[i:]
			break
		}
		n = n*10 + int(r-'0')
	}
	switch unit {
	case "Mi":
		return n
	case "Gi":
		return n * 1024
	}
	t.Fatalf("memory quantity %q: want Mi or Gi", q)
	return 0
}

// ---- systemd -----------------------------------------------------------

// systemdUnit reads deploy/systemd/NAME: section -> key -> values.
func systemdUnit(t *testing.T, name string) map[string]map[string][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root(t), "deploy", "systemd", name))
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string]map[string][]string{}
	section := ""
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			unit[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: %q is not KEY=VALUE in a section", name, i+1, line)
			}
			unit[section][k] = append(unit[section][k], v)
		}
	}
	if unit["Service"] == nil {
		t.Fatalf("%s: no [Service] section", name)
	}
	return unit
}

// TestSystemdUnit: the worker's unit and str serve's, each run by its
// str subcommand with its cgroup subtree delegated, none of the settings
// that make sandboxes impossible, /run/str kept when it stops (every str
// process of the host shares it); str serve's hardening is exactly the
// worker's (its unit says so, and test/systemd measured the worker's
// setting by setting).
func TestSystemdUnit(t *testing.T) {
	units := map[string]map[string]map[string][]string{}
	for name, sub := range map[string]string{"str-worker.service": "worker", "str-serve.service": "serve"} {
		unit := systemdUnit(t, name)
		units[sub] = unit
		svc := unit["Service"]
		if !slices.Equal(svc["Delegate"], []string{"yes"}) {
			t.Errorf("%s: Delegate = %v, want yes", name, svc["Delegate"])
		}
		if es := svc["ExecStart"]; len(es) != 1 || !slices.Equal(strings.Fields(es[0])[1:2], []string{sub}) ||
			filepath.Base(strings.Fields(es[0])[0]) != "str" {
			t.Errorf("%s: ExecStart = %v, want one `.../str %s`", name, es, sub)
		}
		// Options that make sandboxes impossible (measured under systemd
		// by test/systemd, which tries each) must stay off.
		for _, k := range []string{"ProtectKernelLogs", "ProtectKernelTunables", "ProtectControlGroups", "ProcSubset", "ProtectHostname"} {
			if v, ok := svc[k]; ok && !slices.Equal(v, []string{"no"}) {
				t.Errorf("%s: %s=%v would forbid building sandboxes", name, k, v)
			}
		}
		// Namespaces: a list of the kinds a sandbox uses, never "yes".
		if v := svc["RestrictNamespaces"]; slices.Contains(v, "yes") || slices.Contains(v, "true") {
			t.Errorf("%s: RestrictNamespaces=%v: the sandbox is made of namespaces", name, v)
		}
		for k, want := range map[string]string{"RuntimeDirectory": "str", "RuntimeDirectoryMode": "0700", "RuntimeDirectoryPreserve": "yes"} {
			if !slices.Equal(svc[k], []string{want}) {
				t.Errorf("%s: %s = %v, want %s (/run/str is every str process's)", name, k, svc[k], want)
			}
		}
		if unit["Install"] == nil || len(unit["Install"]["WantedBy"]) == 0 {
			t.Errorf("%s: no [Install] WantedBy", name)
		}
		// Documentation= names files install.sh installs (test/systemd
		// checks they are there after it ran): it named one it never did.
		docs := unit["Unit"]["Documentation"]
		if len(docs) == 0 {
			t.Errorf("%s: no Documentation=", name)
		}
		for _, d := range docs {
			for _, u := range strings.Fields(d) {
				path, ok := strings.CutPrefix(u, "file://")
				if !ok {
					continue
				}
				if !installedByInstallSh(t, path) {
					t.Errorf("%s: Documentation=%s: deploy/systemd/install.sh installs no %s", name, u, path)
				}
			}
		}
	}
	// The settings each unit has for itself; every other one the same.
	own := map[string]bool{"Type": true, "Environment": true, "EnvironmentFile": true, "ExecStart": true, "KillMode": true,
		"KillSignal": true, "TimeoutStopSec": true, "Restart": true, "RestartSec": true, "StateDirectory": true,
		"ReadWritePaths": true, "UMask": true}
	w, sv := units["worker"]["Service"], units["serve"]["Service"]
	for _, pair := range [][2]map[string][]string{{w, sv}, {sv, w}} {
		for k := range pair[0] {
			if !own[k] && !slices.Equal(w[k], sv[k]) {
				t.Errorf("%s: str-worker.service %v, str-serve.service %v: str serve's hardening must be the worker's", k, w[k], sv[k])
			}
		}
	}
}

// installedByInstallSh reports whether deploy/systemd/install.sh has an
// install command whose destination is path.
func installedByInstallSh(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "deploy", "systemd", "install.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == "install" && f[len(f)-1] == path {
			return true
		}
	}
	return false
}
