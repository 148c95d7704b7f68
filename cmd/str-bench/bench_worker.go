package main

// The parts of str-bench that need a running worker (echo_tool end to end,
// cold and warm) and the memory cells (Pss of str's own processes per
// sandbox while the tools sleep, next to bubblewrap's).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/worker"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

// benchWorkerNamespace is the SAM namespace of str-bench's workers.
const benchWorkerNamespace = "bench/"

// benchWorker is one throw-away `str worker --embedded-broker` on free
// loopback ports.
type benchWorker struct {
	name     string    // cold, warm, template (str-b-cold... for --str-b: benchStr.id)
	str      *benchStr // the str binary it runs
	token    string    // its embedded broker's token file
	env      []string  // the environment of its clients (str-bench echo): the token file
	manifest string
	broker   string // 127.0.0.1:PORT
	port     int
	health   string // http://127.0.0.1:PORT
	log      string
	cmd      *exec.Cmd
	exited   chan struct{}
	ownDir   string // removed once the worker has stopped ("" = none)
}

func (w *benchWorker) pid() int { return w.cmd.Process.Pid }

// stop ends the worker (SIGTERM, then SIGKILL after 10 s); idempotent.
func (w *benchWorker) stop() {
	if w == nil || w.cmd == nil || w.cmd.Process == nil {
		return
	}
	if w.ownDir != "" {
		defer os.RemoveAll(w.ownDir)
	}
	select {
	case <-w.exited:
		return
	default:
	}
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
	case <-time.After(10 * time.Second):
		w.cmd.Process.Kill()
		<-w.exited
	}
}

// poolMetrics are the worker's /metrics lines about its warm pool and
// its templates, if it has any (hits, misses, size; templates started,
// calls served, fallbacks), for the report's notes.
func (w *benchWorker) poolMetrics() []string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	page, err := benchScrapeMetrics(ctx, w.health)
	if err != nil {
		return nil
	}
	var out []string
	for l := range strings.Lines(string(page)) {
		l = strings.TrimSuffix(l, "\n")
		if !strings.HasPrefix(l, "#") && !strings.Contains(l, "_bucket") && (strings.Contains(l, "pool") || strings.Contains(l, "warm") || strings.Contains(l, "template")) {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return []string{"worker " + w.name + " /metrics at the end: " + strings.Join(out, ", ")}
}

// benchFindExamples locates examples/tools (manifest.yaml and python/):
// the flag, else ./examples/tools, else next to the directory holding this
// binary (bin/str -> examples/tools). It returns why not when there is none.
func benchFindExamples(flagDir, self string) (string, string) {
	cands := []string{flagDir}
	if flagDir == "" {
		cands = []string{"examples/tools", filepath.Join(filepath.Dir(filepath.Dir(self)), "examples/tools")}
	}
	for _, d := range cands {
		if _, err := os.Stat(filepath.Join(d, "manifest.yaml")); err == nil {
			abs, err := filepath.Abs(d)
			if err == nil {
				return abs, ""
			}
		}
	}
	return "", fmt.Sprintf("no example tools (looked for %s/manifest.yaml; run from the repository or pass --examples)", strings.Join(cands, "/manifest.yaml, "))
}

// benchManifestWarm returns tool's warm: value in a manifest, if set.
func benchManifestWarm(data []byte, tool string) (int, bool) {
	var m struct {
		Tools map[string]map[string]any `yaml:"tools"`
	}
	if yaml.Unmarshal(data, &m) != nil {
		return 0, false
	}
	n, ok := m.Tools[tool]["warm"].(int)
	return n, ok
}

// benchSetWarm rewrites a manifest so that every tool for which set
// returns true gets `warm: N` (replacing any value it had); the rest of
// the document is kept as it is.
func benchSetWarm(data []byte, set func(tool string) (int, bool)) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("manifest: not a mapping")
	}
	root := doc.Content[0]
	var tools *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "tools" {
			tools = root.Content[i+1]
		}
	}
	if tools == nil || tools.Kind != yaml.MappingNode {
		return nil, errors.New("manifest: no tools mapping")
	}
	for i := 0; i+1 < len(tools.Content); i += 2 {
		n, ok := set(tools.Content[i].Value)
		tool := tools.Content[i+1]
		if !ok || tool.Kind != yaml.MappingNode {
			continue
		}
		val := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(n)}
		replaced := false
		for j := 0; j+1 < len(tool.Content); j += 2 {
			if tool.Content[j].Value == "warm" {
				tool.Content[j+1], replaced = val, true
			}
		}
		if !replaced {
			tool.Content = append(tool.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "warm"}, val)
		}
	}
	return yaml.Marshal(&doc)
}

// benchTemplateManifest rewrites a manifest for the template worker:
// echo_tool gets `warm: template` and an isolated network (a template
// serves only calls with an isolated network, worker/template.go), every
// other tool warm: 0 (no pool adds to the worker tree's CPU).
func benchTemplateManifest(data []byte) ([]byte, error) {
	data, err := benchSetWarm(data, func(tool string) (int, bool) { return 0, tool != "echo_tool" })
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	tools := doc.Content[0] // benchSetWarm checked the shape
	for i := 0; i+1 < len(tools.Content); i += 2 {
		if tools.Content[i].Value == "tools" {
			tools = tools.Content[i+1]
			break
		}
	}
	var echo *yaml.Node
	for i := 0; i+1 < len(tools.Content); i += 2 {
		if tools.Content[i].Value == "echo_tool" && tools.Content[i+1].Kind == yaml.MappingNode {
			echo = tools.Content[i+1]
		}
	}
	if echo == nil {
		return nil, errors.New("manifest: no echo_tool mapping")
	}
	str := func(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }
	set := map[string]*yaml.Node{
		"warm":    str("template"),
		"network": {Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{str("policy"), str("isolated")}},
	}
	for j := 0; j+1 < len(echo.Content); j += 2 {
		if v, ok := set[echo.Content[j].Value]; ok {
			echo.Content[j+1] = v
			delete(set, echo.Content[j].Value)
		}
	}
	for _, k := range []string{"warm", "network"} {
		if v, ok := set[k]; ok {
			echo.Content = append(echo.Content, str(k), v)
		}
	}
	return yaml.Marshal(&doc)
}

// benchStartTemplateWorker starts the template worker (benchTemplateManifest
// of the example manifest); it returns why not when it cannot run here.
// Its state (work dirs, the runner) is not under /tmp: a template call
// gets a fresh /tmp, which would hide binds below it (the launcher
// refuses such a template, and every call would run cold).
func benchStartTemplateWorker(ctx context.Context, cfg benchSuiteConfig, v *benchStr, examples string) (*benchWorker, string) {
	if os.Geteuid() != 0 {
		return nil, "per-tool templates need root (the worker leases host ids for each call)"
	}
	dir, err := os.MkdirTemp("/var/tmp", "str-bench-template-"+v.tag+".")
	if err != nil {
		return nil, err.Error()
	}
	// Each call's init runs as a host uid of its own and must traverse it.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err.Error()
	}
	if rel, err := filepath.Rel("/tmp", examples); err == nil && !strings.HasPrefix(rel, "..") {
		os.RemoveAll(dir)
		return nil, fmt.Sprintf("the example tools %s are under /tmp, which a template call gets fresh (pass --examples elsewhere)", examples)
	}
	data, err := os.ReadFile(filepath.Join(examples, "manifest.yaml"))
	if err == nil {
		data, err = benchTemplateManifest(data)
	}
	path := filepath.Join(dir, "manifest-template.yaml")
	if err == nil {
		err = os.WriteFile(path, data, 0o644)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err.Error()
	}
	w, err := benchStartWorker(ctx, cfg, v, "template", examples, path, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err.Error()
	}
	w.ownDir = dir
	// echo_tool's template starts in the background at the worker's
	// start; a call before it is ready would run cold.
	if err := benchAwaitTemplate(ctx, w); err != nil {
		w.stop()
		return nil, err.Error()
	}
	return w, ""
}

// benchAwaitTemplate waits (up to 2 minutes) until the template worker
// holds a template (str_worker_templates_live).
func benchAwaitTemplate(ctx context.Context, w *benchWorker) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		page, err := benchScrapeMetrics(sctx, w.health)
		cancel()
		const sample = "str_worker_templates_live"
		if err == nil && benchMetricValues(page, sample)[sample] >= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the template worker started no template within 2 minutes (worker log %s)", w.log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// benchTemplateCalls is the template worker's
// str_worker_template_calls_total for echo_tool (0 when not printed).
func benchTemplateCalls(ctx context.Context, w *benchWorker) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	page, err := benchScrapeMetrics(ctx, w.health)
	if err != nil {
		return 0, err
	}
	const sample = `str_worker_template_calls_total{tool="echo_tool"}`
	return benchMetricValues(page, sample)[sample], nil
}

// benchFreePort asks the kernel for a free loopback port.
func benchFreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// benchStartWorker starts one worker of v as scripts/run.sh does, with
// the example tools and the manifest at manifest, in v's state directory
// (its broker's token file there), and waits for /readyz.
func benchStartWorker(ctx context.Context, cfg benchSuiteConfig, v *benchStr, name, examples, manifest, dir string) (*benchWorker, error) {
	name = v.id(name)
	port, err := benchFreePort()
	if err != nil {
		return nil, err
	}
	hport, err := benchFreePort()
	if err != nil {
		return nil, err
	}
	state := filepath.Join(dir, "worker-"+name)
	if err := os.MkdirAll(state, 0o755); err != nil {
		return nil, err
	}
	token := filepath.Join(v.state, "broker-"+name+".token")
	w := &benchWorker{name: name, str: v, token: token, env: append(os.Environ(), broker.TokenFileEnv+"="+token), manifest: manifest, broker: fmt.Sprintf("127.0.0.1:%d", port), port: port,
		health: fmt.Sprintf("http://127.0.0.1:%d", hport), log: filepath.Join(cfg.out, "worker-"+name+".log"), exited: make(chan struct{})}
	logf, err := os.Create(w.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	w.cmd = exec.Command(v.path, "worker", "--embedded-broker", w.broker)
	env := v.env()
	if env == nil {
		env = os.Environ()
	}
	w.cmd.Env = append(env, broker.TokenFileEnv+"="+token,
		"SAM_NAMESPACE="+benchWorkerNamespace, "MANIFEST_PATH="+manifest, "TOOLS_PYTHON_DIR="+filepath.Join(examples, "python"),
		"ARTIFACT_SERVICE_TYPE=memory", "SANDBOX_WORK_DIR="+filepath.Join(state, "work"), "STR_RUNNER_DIR="+filepath.Join(state, "runner"),
		"STR_SITE_DIR="+filepath.Join(state, "site"), "SANDBOX_PYTHON_BIN="+cfg.python, "HEALTH_PORT="+strconv.Itoa(hport),
		"STR_LOG_LEVEL=warn", "SANDBOX_MAX_CONCURRENT="+strconv.Itoa(max(cfg.k, cfg.conc)),
		// One bench user: every slot is its (no fair share to keep).
		"STR_USER_MAX_RUNNING="+strconv.Itoa(max(cfg.k, cfg.conc)), "STR_USER_MAX_QUEUED=256")
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { w.cmd.Wait(); close(w.exited) }()
	c := http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := c.Get(w.health + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return w, nil
			}
		}
		select {
		case <-w.exited:
			return nil, fmt.Errorf("worker %s exited: %s", name, benchLogTail(w.log))
		case <-ctx.Done():
			w.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			w.stop()
			return nil, fmt.Errorf("worker %s not ready within 60 s: %s", name, benchLogTail(w.log))
		}
	}
}

// benchLogTail is the last line of a worker's log (its fatal error), and
// where the whole log is.
func benchLogTail(path string) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	s := lines[len(lines)-1]
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	if s == "" {
		return "(empty log " + path + ")"
	}
	return s + " (log: " + path + ")"
}

// benchWarmRejected returns the line of a worker log that rejects the
// manifest's warm field, if there is one.
func benchWarmRejected(path string) (string, bool) {
	data, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(data), "\n") {
		if i := strings.Index(l, `field "warm"`); i >= 0 {
			l = strings.TrimSpace(l)
			if j := strings.Index(l, "tools."); j >= 0 {
				l = l[j:]
			}
			l, _, _ = strings.Cut(l, " (known")
			return l, true
		}
	}
	return "", false
}

// benchStartWorkers starts the cold worker (every tool warm: 0) and the
// warm one (the example manifest as it is when it gives echo_tool a pool,
// else echo_tool warm: 2). When the worker rejects the warm field, the cold
// worker runs the example manifest as it is (there is no pool to turn off)
// and the warm cell is skipped with the worker's reason.
func benchStartWorkers(ctx context.Context, cfg benchSuiteConfig, v *benchStr, examples, dir string) (workers []*benchWorker, coldSkip, warmSkip string) {
	example := filepath.Join(examples, "manifest.yaml")
	data, err := os.ReadFile(example)
	if err != nil {
		return nil, err.Error(), err.Error()
	}
	writeManifest := func(name string, set func(string) (int, bool)) (string, error) {
		out, err := benchSetWarm(data, set)
		if err != nil {
			return "", fmt.Errorf("%s: %w", example, err)
		}
		path := filepath.Join(dir, "manifest-"+v.id(name)+".yaml")
		return path, os.WriteFile(path, out, 0o644)
	}
	coldManifest, err := writeManifest("cold", func(string) (int, bool) { return 0, true })
	if err != nil {
		return nil, err.Error(), err.Error()
	}
	cold, err := benchStartWorker(ctx, cfg, v, "cold", examples, coldManifest, dir)
	if err != nil {
		if why, ok := benchWarmRejected(filepath.Join(cfg.out, "worker-"+v.id("cold")+".log")); ok {
			warmSkip = "the worker rejects the manifest field warm, so this str has no warm pool (" + why + ")"
			cold, err = benchStartWorker(ctx, cfg, v, "cold", examples, example, dir)
		}
	}
	if err != nil {
		if warmSkip == "" {
			warmSkip = "the cold worker did not start"
		}
		return nil, err.Error(), warmSkip
	}
	workers = append(workers, cold)
	if warmSkip != "" {
		return workers, "", warmSkip
	}
	warmManifest := example
	if n, ok := benchManifestWarm(data, "echo_tool"); !ok || n < 1 {
		warmManifest, err = writeManifest("warm", func(tool string) (int, bool) { return 2, tool == "echo_tool" })
		if err != nil {
			return workers, "", err.Error()
		}
	}
	warm, err := benchStartWorker(ctx, cfg, v, "warm", examples, warmManifest, dir)
	if err != nil {
		return workers, "", err.Error()
	}
	return append(workers, warm), "", ""
}

// The process tree, read from /proc.

// benchChildren maps each pid to its children (from /proc/*/stat).
func benchChildren() map[int][]int {
	ents, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	return children
}

// benchTreeCPU is the CPU in µs of root and every live descendant, each
// with its reaped children (utime+stime+cutime+cstime). A template's
// calls are reaped by the template, which lives on: its children's CPU
// reaches the worker's cutime only when the template ends, so the
// worker's own /proc/PID/stat does not see it. A process that ends
// between two readings is counted in its parent's cutime at the second.
func benchTreeCPU(root int) (int64, error) {
	var sum int64
	for i, pid := range benchTree(benchChildren(), root) {
		_, all, err := benchProcCPU(pid)
		if err != nil {
			if i == 0 {
				return 0, err
			}
			continue // gone since the listing: its parent's cutime has it
		}
		sum += all
	}
	return sum, nil
}

// benchTree is root and its descendants.
func benchTree(children map[int][]int, root int) []int {
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// benchMemKB is a process's memory in kB from /proc/PID/smaps_rollup:
// Pss (shared pages divided among their mappers) and private (pages only
// it maps, Private_Clean + Private_Dirty, which no other process changes).
type benchMemKB struct{ pss, private int64 }

func benchReadMem(pid int) (benchMemKB, error) {
	var m benchMemKB
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return m, err
	}
	seen := false
	for _, l := range strings.Split(string(data), "\n") {
		k, rest, ok := strings.Cut(l, ":")
		f := strings.Fields(rest)
		if !ok || len(f) == 0 {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "Pss":
			m.pss, seen = v, true
		case "Private_Clean", "Private_Dirty":
			m.private += v
		}
	}
	if !seen {
		return m, fmt.Errorf("/proc/%d/smaps_rollup: no Pss line", pid)
	}
	return m, nil
}

// benchExited says whether pid is gone or a zombie.
func benchExited(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || i+2 >= len(data) || data[i+2] == 'Z' || data[i+2] == 'X'
}

func benchComm(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(data))
}

// benchOwn says whether pid runs the launcher's own code: the binary
// exe, or (for str) an init started from a memfd.
func benchOwn(pid int, exe string) bool {
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	link = strings.TrimSuffix(link, " (deleted)")
	return link == exe || strings.HasPrefix(link, "/memfd:")
}

// benchMemory is one memory cell's result.
type benchMemory struct {
	id, title    string
	perSandboxKB float64
	detail       string
}

// benchOwnMem sums the memory of the launcher's own processes in the
// trees of roots, and counts them.
func benchOwnMem(roots []int, exes ...string) (sum benchMemKB, procs int, err error) {
	children := benchChildren()
	for _, r := range roots {
		for _, pid := range benchTree(children, r) {
			if !slices.ContainsFunc(exes, func(exe string) bool { return benchOwn(pid, exe) }) {
				continue
			}
			m, err := benchReadMem(pid)
			if err != nil {
				return sum, 0, err
			}
			sum.pss += m.pss
			sum.private += m.private
			procs++
		}
	}
	return sum, procs, nil
}

// benchWaitTools waits until the trees of roots hold want processes whose
// comm starts with tool, then a little longer (a Python still importing).
// A root that has exited (a zombie not yet waited for) ends the wait.
func benchWaitTools(ctx context.Context, roots []int, tool string, want int, settle time.Duration) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		children := benchChildren()
		got := 0
		for _, r := range roots {
			if benchExited(r) {
				return fmt.Errorf("process %d exited before its %s ran", r, tool)
			}
			for _, pid := range benchTree(children, r) {
				if strings.HasPrefix(benchComm(pid), tool) {
					got++
				}
			}
		}
		if got >= want {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d %s processes running after 30 s", got, want, tool)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(settle):
	}
	return nil
}

// benchMemLaunchers starts k copies of argv at once (environment env, nil:
// this process's), measures the Pss of
// the launcher's own processes (exes: the launcher's and its egress
// helper's) once every tree runs its `sleep`, and waits for them to finish.
func benchMemLaunchers(ctx context.Context, k int, exes []string, env, argv []string) (mem benchMemKB, procs int, err error) {
	var cmds []*exec.Cmd
	var roots []int
	var errOut syncbuf.Buffer
	defer func() {
		for _, c := range cmds {
			if werr := c.Wait(); werr != nil && err == nil {
				err = fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), werr, benchFirstLine(errOut.String()))
			}
		}
		if err != nil && errOut.Len() > 0 && !strings.Contains(err.Error(), benchFirstLine(errOut.String())) {
			err = fmt.Errorf("%w: %s", err, benchFirstLine(errOut.String()))
		}
	}()
	for i := 0; i < k; i++ {
		c := exec.CommandContext(ctx, argv[0], argv[1:]...)
		c.Env = env
		c.Stderr = &errOut
		if err := c.Start(); err != nil {
			return mem, 0, err
		}
		cmds = append(cmds, c)
		roots = append(roots, c.Process.Pid)
	}
	if err := benchWaitTools(ctx, roots, "sleep", k, 100*time.Millisecond); err != nil {
		return mem, 0, err
	}
	return benchOwnMem(roots, exes...)
}

// measureMemory fills st.memory: first each str's cold worker (the
// cell echo/cold's) with K concurrent slow_operation tools sleeping 5 s
// ((busy - idle) / K); then, with the workers stopped (stopWorkers), each
// str run and bwrap with K concurrent `sleep 5`. Pss divides a shared page
// among the processes that map it, so nothing else may map the launcher's
// binary while it is measured: the workers are gone, the tools are invoked
// from this process (not by str invoke processes), and str run runs from a
// private copy of the binary that only its K launchers share.
func (st *benchState) measureMemory(ctx context.Context, prog *benchProgress, stopWorkers func(), tmp, work string) {
	k := st.cfg.k
	for _, v := range st.strs {
		prog.phase(fmt.Sprintf("memory: %s worker with %d tools sleeping", v.tag, k))
		var cold *benchWorker
		for _, c := range st.cells {
			if c.str == v && c.row == "echo/cold" {
				cold = c.worker
			}
		}
		if cold == nil {
			st.memSkips = append(st.memSkips, v.tag+" worker: no cold worker running (see the echo cells)")
		} else if err := st.memWorker(ctx, v, cold); err != nil {
			st.memSkips = append(st.memSkips, v.tag+" worker: "+err.Error())
		}
	}
	stopWorkers()

	for _, v := range st.strs {
		prog.phase(fmt.Sprintf("memory: %d x %s run -- sleep 5", k, v.tag))
		strCopy := filepath.Join(tmp, v.tag+"-mem")
		// Each launcher's egress helper is counted too, from a private copy
		// of its own (a str without one, an older build, has none to count).
		exes, env := []string{strCopy}, v.env()
		if _, err := os.Stat(v.egress()); err == nil {
			egressCopy := filepath.Join(tmp, v.tag+"-egress-mem")
			if err := benchCopyFile(v.egress(), egressCopy); err != nil {
				st.memSkips = append(st.memSkips, v.tag+" run: copy the egress helper: "+err.Error())
				continue
			}
			if env == nil {
				env = os.Environ()
			}
			exes, env = append(exes, egressCopy), append(env, "STR_EGRESS_BIN="+egressCopy)
		}
		if err := benchCopyFile(v.path, strCopy); err != nil {
			st.memSkips = append(st.memSkips, v.tag+" run: copy the binary: "+err.Error())
		} else if mem, procs, err := benchMemLaunchers(ctx, k, exes, env, []string{strCopy, "run", "--", "sleep", "5"}); err != nil {
			st.memSkips = append(st.memSkips, v.tag+" run: "+err.Error())
		} else {
			st.memory = append(st.memory, benchMemory{id: v.id("str-run"), title: v.title("str run (standard), per sandbox"),
				perSandboxKB: float64(mem.pss) / float64(k), detail: fmt.Sprintf("%d str processes for %d sandboxes; private %.2f MiB per sandbox",
					procs, k, float64(mem.private)/1024/float64(k))})
		}
	}
	prog.phase(fmt.Sprintf("memory: %d x bwrap standard line sleep 5", k))
	if mem, procs, err := benchMemLaunchers(ctx, k, []string{st.bwrap}, nil, append(benchBwrapLine(st.bwrap, work, false), "sleep", "5")); err != nil {
		st.memSkips = append(st.memSkips, "bwrap: "+err.Error())
	} else {
		st.memory = append(st.memory, benchMemory{id: "bwrap", title: "bwrap standard line, per sandbox",
			perSandboxKB: float64(mem.pss) / float64(k), detail: fmt.Sprintf("%d bwrap processes for %d sandboxes; private %.2f MiB per sandbox",
				procs, k, float64(mem.private)/1024/float64(k))})
	}
}

func benchCopyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

func (st *benchState) memWorker(ctx context.Context, v *benchStr, w *benchWorker) error {
	k := st.cfg.k
	// `str worker` execs str-worker, beside str, in the same process: its
	// own processes run that binary, and its egress helper str-egress.
	idle, idleProcs, err := benchOwnMem([]int{w.pid()}, v.worker(), v.egress())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	client, err := devbroker.NewClient(devbroker.ClientOptions{Host: "127.0.0.1", Port: w.port, ClientID: "str-bench-mem-" + randomID(),
		Retries: 3, RetryDelay: 500 * time.Millisecond, ReceiveTimeout: 100 * time.Millisecond,
		TokenFile: w.token, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	defer client.Close()
	base := worker.TopicBase(benchWorkerNamespace)
	replyBase := base + "/sam_remote_tool/response/benchmem"
	if err := client.Connect(ctx, []string{replyBase + "/>"}); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	ids := map[string]bool{}
	for i := 0; i < k; i++ {
		id := randomID()
		ids[id] = true
		payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": worker.MethodInvoke,
			"params": map[string]any{"task_id": "task-" + id, "tool_name": "slow_operation", "args": map[string]any{"steps": 1, "delay": 5},
				"app_name": "bench", "user_id": "bench-user", "session_id": "bench-session"}})
		err := client.Publish(ctx, transport.Message{Topic: base + "/sam_remote_tool/invoke/slow_operation", Payload: payload,
			UserProperties: map[string]string{worker.PropReplyTo: replyBase + "/" + id, "clientId": "str-bench", "userId": "bench-user"}})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	if err := benchWaitTools(ctx, []int{w.pid()}, "python", k, 500*time.Millisecond); err != nil {
		return err
	}
	busy, procs, err := benchOwnMem([]int{w.pid()}, v.worker(), v.egress())
	if err != nil {
		return err
	}
	// Every reply, so that the tools are gone before the next phase.
	for len(ids) > 0 {
		d, err := client.Receive(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %d slow_operation replies: %w", len(ids), err)
		}
		var r struct {
			ID     string           `json:"id"`
			Result *json.RawMessage `json:"result"`
			Error  *json.RawMessage `json:"error"`
		}
		if json.Unmarshal(d.Payload, &r) == nil && (r.Result != nil || r.Error != nil) {
			if r.Error != nil && ids[r.ID] {
				return fmt.Errorf("slow_operation failed: %s", d.Payload)
			}
			delete(ids, r.ID)
		}
	}
	st.memory = append(st.memory, benchMemory{id: v.id("worker"), title: v.title("str worker, per sandbox ((busy - idle) / K)"),
		perSandboxKB: float64(busy.pss-idle.pss) / float64(k),
		detail: fmt.Sprintf("Pss idle %.1f MiB in %d str-worker process(es), busy %.1f MiB in %d; private per sandbox %.2f MiB",
			float64(idle.pss)/1024, idleProcs, float64(busy.pss)/1024, procs, float64(busy.private-idle.private)/1024/float64(k))})
	return nil
}
