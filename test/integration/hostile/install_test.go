package hostile

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// The installation cases (issue 18 §1): each starts a worker of its own
// whose manifest declares hostile packages, built by the test from
// testdata/install (a wheel is a zip, an sdist a tar.gz; no network) and
// served from the wheels folder next to the manifest or from a PEP 503
// index the test serves on loopback. Every payload tries to leave a
// marker at a path of the host's temp dir and to reach a host listener;
// each case proves the marker is absent on the host and the listener
// accepted nothing, and, where the payload does run (a tool's sandbox, the
// installation sandbox), that it ran there (hostname "sandbox").

const installDir = "testdata/install"

// pkgFiles is one hostile package: its files (testdata paths, relative
// to installDir, each placed at its base name) and its name and version.
type pkgFiles struct {
	dist, version string
	files         []string
}

var (
	pkgSitecustomize = pkgFiles{"str-evil-sc", "1.0", []string{"sitecustomize/sitecustomize.py", "sitecustomize/strsc.py", "evidence/str_evidence.py"}}
	pkgPth           = pkgFiles{"str-evil-pth", "1.0", []string{"pth/str_evil.pth", "pth/strpth.py", "evidence/str_evidence.py"}}
	pkgBuild         = pkgFiles{"str-evil-build", "1.0", []string{"build/pyproject.toml", "build/backend.py", "evidence/str_evidence.py"}}
	pkgVictim        = pkgFiles{"str-victim", "1.0", []string{"victim/victimmod.py"}}
	pkgShadow        = pkgFiles{"str-shadow", "6.6", []string{"shadow/victimmod.py"}}
)

// installRun is one installation case's worker and what its payloads aim at.
type installRun struct {
	e        *env
	w        *workerProc
	a        *agent
	marker   string // the host path the payloads try to create
	accepts  atomic.Int64
	listener int
	wheels   string
}

// newInstallRun prepares a worker env for manifest (tools of
// install_tools) and a host listener; the caller adds packages, then
// calls start.
func newInstallRun(t *testing.T, manifest string) *installRun {
	t.Helper()
	r := &installRun{e: newEnv(t, manifest)}
	copyFile(t, filepath.Join(installDir, "install_tools.py"), filepath.Join(r.e.tools, "install_tools.py"))
	r.marker = filepath.Join(r.e.root, "payload-ran-on-the-host")
	r.wheels = filepath.Join(filepath.Dir(r.e.manifest), "wheels")
	must(t, os.MkdirAll(r.wheels, 0o755))
	ln := countingListener(t, "tcp", "127.0.0.1:0", &r.accepts)
	r.listener = ln.Addr().(*net.TCPAddr).Port
	return r
}

// contents reads p's files with the run's values substituted.
func (r *installRun) contents(t *testing.T, p pkgFiles) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range p.files {
		b, err := os.ReadFile(filepath.Join(installDir, f))
		must(t, err)
		s := strings.ReplaceAll(string(b), "{marker}", r.marker)
		out[filepath.Base(f)] = strings.ReplaceAll(s, "{listener}", strconv.Itoa(r.listener))
	}
	return out
}

// wheel writes p as a pure-Python wheel (with METADATA, WHEEL and a
// RECORD of sha256s) into dir.
func (r *installRun) wheel(t *testing.T, dir string, p pkgFiles) {
	t.Helper()
	under := strings.ReplaceAll(p.dist, "-", "_")
	di := under + "-" + p.version + ".dist-info"
	files := r.contents(t, p)
	files[di+"/METADATA"] = "Metadata-Version: 2.1\nName: " + p.dist + "\nVersion: " + p.version + "\n"
	files[di+"/WHEEL"] = "Wheel-Version: 1.0\nGenerator: str-hostile\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var record strings.Builder
	for _, n := range names {
		sum := sha256.Sum256([]byte(files[n]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", n, base64.RawURLEncoding.EncodeToString(sum[:]), len(files[n]))
	}
	record.WriteString(di + "/RECORD,,\n")
	files[di+"/RECORD"] = record.String()
	names = append(names, di+"/RECORD")
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, n := range names {
		w, err := zw.Create(n)
		must(t, err)
		_, err = w.Write([]byte(files[n]))
		must(t, err)
	}
	must(t, zw.Close())
	must(t, os.WriteFile(filepath.Join(dir, under+"-"+p.version+"-py3-none-any.whl"), buf.Bytes(), 0o644))
}

// sdist writes p as a source distribution (tar.gz with PKG-INFO) into
// dir and returns its file name.
func (r *installRun) sdist(t *testing.T, dir string, p pkgFiles) string {
	t.Helper()
	under := strings.ReplaceAll(p.dist, "-", "_")
	top := under + "-" + p.version
	files := r.contents(t, p)
	files["PKG-INFO"] = "Metadata-Version: 2.1\nName: " + p.dist + "\nVersion: " + p.version + "\n"
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	must(t, tw.WriteHeader(&tar.Header{Name: top + "/", Typeflag: tar.TypeDir, Mode: 0o755}))
	for n, c := range files {
		must(t, tw.WriteHeader(&tar.Header{Name: top + "/" + n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(c))}))
		_, err := tw.Write([]byte(c))
		must(t, err)
	}
	must(t, tw.Close())
	must(t, gz.Close())
	name := top + ".tar.gz"
	must(t, os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644))
	return name
}

// index serves dir as a PEP 503 simple index on the host's loopback and
// returns its URL and a count of the files downloaded.
func (r *installRun) index(t *testing.T, dir string) (string, *atomic.Int64) {
	t.Helper()
	var downloads atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/{project}/", func(w http.ResponseWriter, req *http.Request) {
		project := req.PathValue("project")
		ents, _ := os.ReadDir(dir)
		fmt.Fprintln(w, "<!DOCTYPE html><html><body>")
		for _, e := range ents {
			n := e.Name()
			base := strings.TrimSuffix(strings.TrimSuffix(n, ".tar.gz"), ".whl")
			dist, _, _ := strings.Cut(base, "-")
			if strings.ReplaceAll(dist, "_", "-") != project {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, n))
			if err != nil {
				continue
			}
			sum := sha256.Sum256(b)
			fmt.Fprintf(w, "<a href=\"/files/%s#sha256=%s\">%s</a><br>\n", n, hex.EncodeToString(sum[:]), n)
		}
		fmt.Fprintln(w, "</body></html>")
	})
	mux.HandleFunc("/files/{name}", func(w http.ResponseWriter, req *http.Request) {
		downloads.Add(1)
		http.ServeFile(w, req, filepath.Join(dir, filepath.Base(req.PathValue("name"))))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/simple/", &downloads
}

func (r *installRun) start(t *testing.T, extra map[string]string) {
	t.Helper()
	r.w = startWorker(t, r.e, extra)
	r.a = newAgent(t, r.w.port)
	t.Cleanup(func() {
		if _, err := os.Stat(r.marker); !os.IsNotExist(err) {
			b, _ := os.ReadFile(r.marker)
			t.Errorf("a package's code ran on the host: %s exists (%q, %v)", r.marker, b, err)
		}
		if n := r.accepts.Load(); n != 0 {
			t.Errorf("the host listener accepted %d connections from a payload", n)
		}
	})
}

// call invokes tool as a reference agent does (sandbox_profile
// "standard", timeout_seconds 300) and returns the reply.
func (r *installRun) call(t *testing.T, tool string) (reply, map[string]any, []byte) {
	t.Helper()
	id := r.a.invoke(tool, map[string]any{"args": map[string]any{}, "sandbox_profile": "standard", "timeout_seconds": 300})
	raw := r.a.reply(t, id, rpcWait)
	var rep reply
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("reply: %v\n%.2000s", err, raw)
	}
	var res map[string]any
	if rep.Result != nil {
		_ = json.Unmarshal(rep.Result.ToolResult, &res)
	}
	return rep, res, raw
}

// unavailable is /readyz's reason for tool, or "".
func (r *installRun) unavailable(t *testing.T, tool string) string {
	t.Helper()
	_, body := r.w.get("/readyz")
	var rz struct {
		UnavailableTools map[string]string `json:"unavailable_tools"`
	}
	if err := json.Unmarshal([]byte(body), &rz); err != nil {
		t.Fatalf("readyz: %v: %s", err, body)
	}
	return rz.UnavailableTools[tool]
}

// ranInSandbox checks a payload's evidence: it ran, as the sandbox's
// unprivileged uid in a sandbox (hostname "sandbox"), and its connection
// to the host listener failed.
func ranInSandbox(t *testing.T, res map[string]any, raw []byte, tag string) {
	t.Helper()
	ev, _ := res["evidence"].(map[string]any)
	if ev == nil {
		t.Fatalf("no evidence that the %s payload ran at all (the case proves nothing): %.3000s", tag, raw)
	}
	if ev["tag"] != tag || ev["hostname"] != "sandbox" || ev["uid"] == 0.0 || ev["listener"] == "connected" {
		t.Fatalf("the %s payload did not run confined: %v", tag, ev)
	}
}

func installSitecustomize(t *testing.T, _ *harness, _ hcase) {
	r := newInstallRun(t, "tools:\n  sc: {module: install_tools, function: sitecustomize, package: str-evil-sc}\n")
	r.wheel(t, r.wheels, pkgSitecustomize)
	r.start(t, nil)
	rep, res, raw := r.call(t, "sc")
	if rep.Result == nil {
		t.Fatalf("want a result, got %.3000s", raw)
	}
	// The runner starts Python with -S: site.py imports no
	// sitecustomize at start, not even in the tool's sandbox.
	if res["at_start"] != nil {
		t.Fatalf("the package's sitecustomize.py ran at the interpreter's start: %v", res["at_start"])
	}
	// The package is there all the same: imported by the tool's own code,
	// it runs in the tool's sandbox, where it belongs.
	ranInSandbox(t, res, raw, "sitecustomize")
}

func installPth(t *testing.T, _ *harness, _ hcase) {
	r := newInstallRun(t, "tools:\n  pth: {module: install_tools, function: pth, package: str-evil-pth}\n")
	r.wheel(t, r.wheels, pkgPth)
	r.start(t, nil)
	rep, res, raw := r.call(t, "pth")
	if rep.Result == nil {
		t.Fatalf("want a result, got %.3000s", raw)
	}
	// A .pth file runs only in a site-packages dir: a package's own site
	// dir is a PYTHONPATH entry, so the line is never executed, in the
	// tool's sandbox or anywhere else.
	if res["evidence"] != nil {
		t.Fatalf("the .pth line ran: %v", res["evidence"])
	}
}

func installSdistRefused(t *testing.T, _ *harness, _ hcase) {
	r := newInstallRun(t, "tools:\n  built: {module: install_tools, function: built, package: str-evil-build}\n")
	r.sdist(t, r.wheels, pkgBuild)
	r.start(t, nil)
	why := r.unavailable(t, "built")
	if !strings.Contains(why, "package str-evil-build could not be installed") {
		t.Fatalf("readyz reason %q: want the sdist refused", why)
	}
	rep, _, raw := r.call(t, "built")
	if rep.Error == nil || rep.Error.Code != "TOOL_NOT_AVAILABLE" {
		t.Fatalf("want TOOL_NOT_AVAILABLE, got %.3000s", raw)
	}
}

func installSdistBuild(t *testing.T, _ *harness, _ hcase) {
	r := newInstallRun(t, "tools:\n  built: {module: install_tools, function: built, package: str-evil-build}\n")
	r.sdist(t, r.wheels, pkgBuild)
	r.start(t, map[string]string{"STR_PACKAGE_ALLOW_BUILDS": "true"})
	rep, res, raw := r.call(t, "built")
	if rep.Result == nil {
		t.Fatalf("want a result, got %.3000s", raw)
	}
	// The build hook ran in the installation sandbox: isolated network.
	ranInSandbox(t, res, raw, "build_hook")
}

func installIndex(t *testing.T, _ *harness, _ hcase) {
	r := newInstallRun(t, "tools:\n  built: {module: install_tools, function: built, package: str-evil-build, version: \"==1.0\"}\n")
	served := filepath.Join(r.e.root, "index-files")
	must(t, os.MkdirAll(served, 0o755))
	r.sdist(t, served, pkgBuild)
	url, downloads := r.index(t, served)
	r.start(t, map[string]string{"STR_PACKAGE_INDEX_URL": url, "STR_PACKAGE_ALLOW_BUILDS": "true"})
	rep, res, raw := r.call(t, "built")
	if rep.Result == nil {
		t.Fatalf("want a result, got %.3000s", raw)
	}
	if downloads.Load() == 0 {
		t.Fatal("the package did not come from the index")
	}
	// The build hook ran in the installation sandbox, which reached the
	// index (restricted to its address and port) and nothing else: its
	// CONNECT through the proxy to another port of the same address was
	// refused.
	ranInSandbox(t, res, raw, "build_hook")
	ev := res["evidence"].(map[string]any)
	t.Logf("build hook evidence: %v", ev)
	if vp, _ := ev["via_proxy"].(string); vp == "" || strings.Contains(vp, " 200") {
		t.Fatalf("the build hook's CONNECT through the proxy: %q, want a refusal", vp)
	}
	if !strings.Contains(r.w.log.String(), `"msg":"package installed","package":"str-evil-build","version":"1.0","declared_version":"==1.0","from":"`+url+`"`) {
		t.Errorf("the installation is not logged with its index")
	}
}

func installShadow(t *testing.T, _ *harness, _ hcase) {
	r := newInstallRun(t, `tools:
  victim: {module: install_tools, function: which, package: str-victim}
  shadow: {module: install_tools, function: which, package: str-shadow}
`)
	r.wheel(t, r.wheels, pkgVictim)
	r.wheel(t, r.wheels, pkgShadow)
	r.start(t, nil)
	for tool, who := range map[string]string{"victim": "victim", "shadow": "shadow"} {
		rep, res, raw := r.call(t, tool)
		if rep.Result == nil || res["who"] != who {
			t.Fatalf("%s imported victimmod of %v, want %s's: %.3000s", tool, res["who"], who, raw)
		}
	}
}

func installIndexOffsite(t *testing.T, _ *harness, _ hcase) {
	r := newInstallRun(t, "tools:\n  sc: {module: install_tools, function: sitecustomize, package: str-evil-sc}\n")
	// The index's page links the wheel on another port of the host's
	// loopback (the counting listener): pip follows it and the policy,
	// restricted to the index's port, refuses.
	offsite := fmt.Sprintf("http://127.0.0.1:%d/files/str_evil_sc-1.0-py3-none-any.whl", r.listener)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=%q>str_evil_sc-1.0-py3-none-any.whl</a></body></html>\n", offsite)
	}))
	t.Cleanup(srv.Close)
	r.start(t, map[string]string{"STR_PACKAGE_INDEX_URL": srv.URL + "/simple/"})
	why := r.unavailable(t, "sc")
	if !strings.Contains(why, "could not be installed") || !strings.Contains(why, fmt.Sprintf("denied 127.0.0.1:%d", r.listener)) {
		t.Fatalf("readyz reason %q: want the installation refused the off-index host", why)
	}
}
