package profiles

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const (
	ki = 1 << 10
	mi = 1 << 20
	gi = 1 << 30
)

func mustEmbedded(t *testing.T) *Set {
	t.Helper()
	s, err := Embedded()
	if err != nil {
		t.Fatalf("Embedded(): %v", err)
	}
	return s
}

func mustLookup(t *testing.T, s *Set, name string) *Profile {
	t.Helper()
	p, err := s.Lookup(name)
	if err != nil {
		t.Fatalf("Lookup(%q): %v", name, err)
	}
	return p
}

// fieldErrors flattens an errors.Join tree into its *FieldError leaves.
func fieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(e error) {
		if fe, ok := e.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			if c := u.Unwrap(); c != nil {
				walk(c)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

func fieldsOf(err error) []string {
	var fs []string
	for _, fe := range fieldErrors(err) {
		fs = append(fs, fe.Field)
	}
	return fs
}

func TestEmbeddedFilesDecodeAndValidate(t *testing.T) {
	entries, err := fs.ReadDir(embedded, ".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		data, err := fs.ReadFile(embedded, e.Name())
		if err != nil {
			t.Fatal(err)
		}
		p, err := Decode(data, e.Name())
		if err != nil {
			t.Errorf("Decode(%s): %v", e.Name(), err)
			continue
		}
		if err := p.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", e.Name(), err)
		}
		names = append(names, p.Name)
	}
	want := []string{"confidential", "permissive", "restrictive", "standard"}
	if !slices.Equal(names, want) {
		t.Errorf("embedded profiles = %v, want %v", names, want)
	}
	if got := mustEmbedded(t).Names(); !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
}

// TestReferenceNumbers pins the numbers of str-protocol.md §6.
func TestReferenceNumbers(t *testing.T) {
	type row struct {
		as, fsize, memory, tmp, devShm Quantity
		cpu, timeout                   time.Duration
		nofile, nproc, pids            int64
		cpus                           Quantity
		network, seccomp               string
		writableVar                    bool
		passthrough                    []string
	}
	pass := []string{"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}
	want := map[string]row{
		"restrictive":  {512 * mi, 64 * mi, 512 * mi, 64 * mi, 16 * mi, 60 * time.Second, 60 * time.Second, 128, 32, 32, 1000, "none", "restrictive", false, nil},
		"standard":     {1 * gi, 256 * mi, 1 * gi, 256 * mi, 64 * mi, 300 * time.Second, 300 * time.Second, 512, 128, 128, 2000, "host", "standard", false, pass},
		"permissive":   {4 * gi, 1 * gi, 4 * gi, 1 * gi, 64 * mi, 600 * time.Second, 600 * time.Second, 1024, 512, 512, 4000, "host", "permissive", true, pass},
		"confidential": {512 * mi, 64 * mi, 512 * mi, 64 * mi, 0, 60 * time.Second, 60 * time.Second, 128, 32, 32, 1000, "none", "restrictive", false, nil},
	}
	s := mustEmbedded(t)
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			p := mustLookup(t, s, name)
			r := p.Rlimits
			var tmp Quantity
			writableVar := false
			for _, m := range p.Mounts.Tmpfs {
				switch m.Path {
				case "/tmp":
					tmp = m.Size
					if m.Mode != "1777" {
						t.Errorf("/tmp mode = %q, want 1777", m.Mode)
					}
				case "/var":
					writableVar = true
				}
			}
			got := row{Quantity(r.AS), r.FSize, p.Cgroup.Memory, tmp, p.Mounts.DevShm,
				time.Duration(r.CPU), time.Duration(p.Timeout), r.NoFile, r.NProc, p.Cgroup.Pids,
				p.Cgroup.CPUs, p.Network, p.Seccomp, writableVar, p.Env.Passthrough}
			if len(got.passthrough) == 0 {
				got.passthrough = nil
			}
			if !reflect.DeepEqual(got, w) {
				t.Errorf("got  %+v\nwant %+v", got, w)
			}
			if r.Core != 0 || r.Stack != 8*mi {
				t.Errorf("core = %d, stack = %d; want 0, 8Mi", r.Core, r.Stack)
			}
		})
	}
}

func TestCommonSettings(t *testing.T) {
	s := mustEmbedded(t)
	wantEnv := map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
	required := []string{"/usr", "/lib", "/bin", "/sbin"}
	optional := []string{"/lib32", "/lib64", "/libx32", "/etc/resolv.conf", "/etc/ssl", "/etc/ld.so.cache",
		"/etc/localtime", "/etc/nsswitch.conf", "/etc/hosts", "/etc/alternatives"}
	for _, name := range s.Names() {
		p := mustLookup(t, s, name)
		if p.UID != 65534 || p.GID != 65534 || p.Hostname != "sandbox" || p.UserNamespace != "auto" ||
			!p.Mounts.GeneratePasswd || p.BestEffort || p.Version != 1 {
			t.Errorf("%s: uid %d gid %d hostname %q userns %q generate_passwd %v best_effort %v version %d",
				name, p.UID, p.GID, p.Hostname, p.UserNamespace, p.Mounts.GeneratePasswd, p.BestEffort, p.Version)
		}
		if !reflect.DeepEqual(p.Env.Set, wantEnv) {
			t.Errorf("%s: env.set = %v, want %v", name, p.Env.Set, wantEnv)
		}
		binds := map[string]bool{} // path -> optional
		for _, b := range p.Mounts.ReadOnly {
			binds[b.Path] = b.Optional
		}
		for _, r := range required {
			if opt, ok := binds[r]; !ok || opt {
				t.Errorf("%s: ro_bind %s: present %v optional %v, want required", name, r, ok, opt)
			}
		}
		for _, o := range optional {
			if opt, ok := binds[o]; !ok || !opt {
				t.Errorf("%s: ro_bind %s: present %v optional %v, want optional", name, o, ok, opt)
			}
		}
		for _, m := range p.Mounts.Tmpfs {
			if m.Path != "/tmp" && !(name == "permissive" && m.Path == "/var") {
				t.Errorf("%s: unexpected writable tmpfs %s", name, m.Path)
			}
		}
	}
}

// TestPythonNeedsAreBound checks, on this machine, that the host paths
// /usr/bin/python3 resolves through are under some ro_bind of the
// restrictive profile, so the embedded profiles can run Python here.
func TestPythonNeedsAreBound(t *testing.T) {
	if _, err := os.Lstat("/usr/bin/python3"); err != nil {
		t.Skipf("no /usr/bin/python3 on this host (%v); nothing to check", err)
	}
	p := mustLookup(t, mustEmbedded(t), "restrictive")
	covered := func(path string) bool {
		for _, b := range p.Mounts.ReadOnly {
			if path == b.Path || strings.HasPrefix(path, b.Path+"/") {
				return true
			}
		}
		return false
	}
	// Walk the symlink chain by hand: each hop must be visible inside.
	path := "/usr/bin/python3"
	for range 40 {
		if !covered(path) {
			t.Fatalf("python3 resolves through %s, which no ro_bind covers", path)
		}
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return
		}
		target, err := os.Readlink(path)
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	t.Fatal("symlink loop resolving /usr/bin/python3")
}

func TestAliases(t *testing.T) {
	s := mustEmbedded(t)
	for alias, want := range map[string]string{
		"trusted": "permissive", "untrusted": "restrictive", "confidential": "confidential",
		"standard": "standard", "restrictive": "restrictive", "permissive": "permissive",
	} {
		if got := mustLookup(t, s, alias).Name; got != want {
			t.Errorf("Lookup(%q).Name = %q, want %q", alias, got, want)
		}
	}
	if got := s.Aliases(); !reflect.DeepEqual(got, map[string]string{"trusted": "permissive", "untrusted": "restrictive"}) {
		t.Errorf("Aliases() = %v", got)
	}
	if got := s.Source("untrusted"); got != "embedded:restrictive.yaml" {
		t.Errorf("Source(untrusted) = %q", got)
	}
}

func TestLookupUnknown(t *testing.T) {
	s := mustEmbedded(t)
	for _, name := range []string{"", "bogus", "Standard", "trusted "} {
		p, err := s.Lookup(name)
		if !errors.Is(err, ErrUnknownProfile) || p != nil {
			t.Errorf("Lookup(%q) = %v, %v; want ErrUnknownProfile", name, p, err)
			continue
		}
		for _, valid := range []string{"confidential", "permissive", "restrictive", "standard", "trusted->permissive", "untrusted->restrictive"} {
			if !strings.Contains(err.Error(), valid) {
				t.Errorf("Lookup(%q) error %q does not list %s", name, err, valid)
			}
		}
	}
}

func TestLookupReturnsCopy(t *testing.T) {
	s := mustEmbedded(t)
	p := mustLookup(t, s, "standard")
	p.Cgroup.Memory = 1
	p.Env.Set["PATH"] = "/evil"
	p.Mounts.ReadOnly[0].Path = "/"
	p.Env.Passthrough[0] = "LD_PRELOAD"
	q := mustLookup(t, s, "standard")
	if q.Cgroup.Memory != 1*gi || q.Env.Set["PATH"] == "/evil" || q.Mounts.ReadOnly[0].Path != "/usr" || q.Env.Passthrough[0] == "LD_PRELOAD" {
		t.Errorf("changing a looked-up profile changed the set: %+v", q)
	}
}

// validYAML is a small valid profile used as a base for the decode tests.
const validYAML = `version: 1
name: extra
description: a test profile
aliases: [extra-alias]
user_namespace: always
network: none
hostname: box.example
uid: 1000
gid: 1000
rlimits: {as: 256Mi, cpu: 30, fsize: 1M, nofile: 64, nproc: 16, stack: 8Mi, core: 0}
cgroup: {memory: 1.5Gi, cpus: 500m, pids: 16}
timeout: 1m30s
mounts:
  ro_binds: [{path: /usr}]
  tmpfs: [{path: /tmp, size: 10Mi, mode: "1777"}]
  dev_shm: 0
  generate_passwd: false
env:
  set: {PATH: /usr/bin}
  passthrough: [TZ]
seccomp: restrictive
`

func TestDecodeValid(t *testing.T) {
	p, err := Decode([]byte(validYAML), "extra.yaml")
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if p.Rlimits.CPU != Duration(30*time.Second) || p.Rlimits.FSize != 1000000 ||
		p.Cgroup.Memory != 1536*mi || p.Cgroup.CPUs != 500 || p.Timeout != Duration(90*time.Second) {
		t.Errorf("decoded %+v", p)
	}
}

func TestDecodeStrict(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown top-level field", validYAML + "memory: 1Gi\n", "field memory not found"},
		{"unknown rlimits field", strings.Replace(validYAML, "core: 0}", "core: 0, cores: 0}", 1), "field cores not found"},
		{"unknown cgroup field", strings.Replace(validYAML, "pids: 16}", "pids: 16, swap: 1Gi}", 1), "field swap not found"},
		{"unknown mounts field", strings.Replace(validYAML, "  dev_shm: 0\n", "  dev_shm: 0\n  rw_binds: []\n", 1), "field rw_binds not found"},
		{"misspelled field", strings.Replace(validYAML, "hostname:", "host_name:", 1), "field host_name not found"},
		{"second document", validYAML + "---\nversion: 1\n", "more than one YAML document"},
		{"empty file", "", "empty file"},
		{"duplicate key", validYAML + "network: host\n", "already defined"},
		{"duplicate cgroup key", strings.Replace(validYAML, "pids: 16}", "pids: 16, pids: 17}", 1), "already defined"},
		{"bad byte quantity", strings.Replace(validYAML, "as: 256Mi", "as: 256MB", 1), `unknown suffix "MB"`},
		{"bad cpu quantity", strings.Replace(validYAML, "cpus: 500m", "cpus: 2Gi", 1), `unknown suffix "Gi"`},
		{"bad duration", strings.Replace(validYAML, "timeout: 1m30s", "timeout: soon", 1), `"soon" as duration`},
		{"quantity not scalar", strings.Replace(validYAML, "as: 256Mi", "as: [1]", 1), "must be a scalar"},
		{"cgroup not mapping", strings.Replace(validYAML, "cgroup: {memory: 1.5Gi, cpus: 500m, pids: 16}", "cgroup: 4", 1), "cgroup must be a mapping"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Decode([]byte(tt.yaml), "x.yaml")
			if err == nil {
				t.Fatalf("Decode succeeded (%+v), want error containing %q", p, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "x.yaml") {
				t.Errorf("error %q does not contain %q and the file name", err, tt.want)
			}
		})
	}
}

// TestDecodeCollectsAllDecodeErrors: several bad quantities are reported
// together, not just the first.
func TestDecodeCollectsAllDecodeErrors(t *testing.T) {
	y := strings.NewReplacer("as: 256Mi", "as: 1x", "cpus: 500m", "cpus: -1", "timeout: 1m30s", "timeout: later", "pids: 16}", "pids: 16, bogus: 1}").Replace(validYAML)
	_, err := Decode([]byte(y), "x.yaml")
	if err == nil {
		t.Fatal("Decode succeeded")
	}
	for _, want := range []string{`"1x"`, `"-1"`, `"later"`, "field bogus not found"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q misses %s", err, want)
		}
	}
}

func TestBadProfileReportsEveryProblem(t *testing.T) {
	bad := `version: 2
name: Bad_Name
description: ""
aliases: [Bad_Name, ok, ok]
user_namespace: sometimes
network: bridge
hostname: -bad-
uid: 0
gid: 4294967295
rlimits: {as: 0, cpu: 1500ms, fsize: 0, nofile: 0, nproc: -1, stack: 0, core: 1Mi}
cgroup: {memory: 0, cpus: 0, pids: 0}
timeout: 0
mounts:
  ro_binds: [{path: usr}, {path: /usr/../etc}, {path: /usr/}, {path: /proc/self}, {path: /}, {path: /opt}, {path: /opt}]
  tmpfs: [{path: /tmp, size: 0, mode: "4777"}, {path: /var, size: 1Mi, mode: "9"}, {path: /dev/shm, size: 1Mi, mode: "1777"}]
  dev_shm: 0
env:
  set: {"1BAD": x, "OK": y}
  passthrough: [OK, "BAD-NAME", TZ, TZ]
seccomp: ""
`
	_, err := Decode([]byte(bad), "bad.yaml")
	if err == nil {
		t.Fatal("Decode succeeded")
	}
	fes := fieldErrors(err)
	for _, fe := range fes {
		if fe.Source != "bad.yaml" || fe.Profile != "Bad_Name" {
			t.Errorf("FieldError %+v lacks source or profile", fe)
		}
	}
	want := []string{
		"version", "name", "aliases[0]", "aliases[0]", "aliases[2]", "description", "user_namespace", "network", "hostname",
		"uid", "gid", "rlimits.as", "rlimits.fsize", "rlimits.stack", "rlimits.cpu", "rlimits.nofile", "rlimits.nproc", "rlimits.core",
		"cgroup.memory", "cgroup.cpus", "cgroup.pids",
		"mounts.ro_binds[0].path", "mounts.ro_binds[1].path", "mounts.ro_binds[2].path", "mounts.ro_binds[3].path", "mounts.ro_binds[4].path",
		"mounts.tmpfs[2].path",
		"mounts.ro_binds[6].path", // duplicate of [5]
		"mounts.tmpfs[0].size", "mounts.tmpfs[0].mode", "mounts.tmpfs[1].mode",
		"env.set", "env.passthrough[0]", "env.passthrough[1]", "env.passthrough[3]",
		"seccomp",
	}
	got := fieldsOf(err)
	if !slices.Equal(got, want) {
		t.Errorf("fields with problems:\n got  %q\n want %q\nerror:\n%v", got, want, err)
	}
	// The message of each problem names the file, the profile and the field.
	if !strings.Contains(err.Error(), "bad.yaml: profile Bad_Name: cgroup.memory: must be set and > 0, got 0") {
		t.Errorf("error text:\n%v", err)
	}
}

func TestValidateNil(t *testing.T) {
	var p *Profile
	if err := p.Validate(); err == nil {
		t.Error("nil profile validated")
	}
}

func TestParseBytes(t *testing.T) {
	valid := map[string]Quantity{
		"0": 0, "1000": 1000, "1k": 1000, "4G": 4e9, "1M": 1e6, "2T": 2e12, "1P": 1e15, "9E": 9e18,
		"512Mi": 512 * mi, "2Gi": 2 * gi, "1Ki": ki, "1Ti": 1 << 40, "1Pi": 1 << 50, "7Ei": 7 << 60,
		"1.5Gi": 1536 * mi, "0.5Ki": 512, "1.5k": 1500, "0.001k": 1, "007": 7,
		"9223372036854775807": 1<<63 - 1,
	}
	for s, want := range valid {
		got, err := ParseBytes(s)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	invalid := []string{
		"", "-1", "-1Gi", "+1", "1.5", "0.0001k", "8Ei", "10E", "9223372036854775808", "1GB", "1g", "1gi",
		"1 Gi", " 1", "1m", "1e3", ".5Gi", "1.Gi", "Gi", "abc", "1.2.3", "0x10", "1_000",
		strings.Repeat("9", 50),
	}
	for _, s := range invalid {
		if got, err := ParseBytes(s); err == nil || !errors.Is(err, ErrBadQuantity) {
			t.Errorf("ParseBytes(%q) = %d, %v; want ErrBadQuantity", s, got, err)
		}
	}
}

func TestParseCPUs(t *testing.T) {
	valid := map[string]Quantity{"1": 1000, "2": 2000, "500m": 500, "1.5": 1500, "0.25": 250, "0.001": 1, "1000m": 1000, "0": 0}
	for s, want := range valid {
		got, err := ParseCPUs(s)
		if err != nil || got != want {
			t.Errorf("ParseCPUs(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "-1", "0.0005", "1.5m", "1Gi", "1k", "two", "1 ", "9223372036854775807"} {
		if got, err := ParseCPUs(s); !errors.Is(err, ErrBadQuantity) {
			t.Errorf("ParseCPUs(%q) = %d, %v; want ErrBadQuantity", s, got, err)
		}
	}
}

func TestParseDuration(t *testing.T) {
	valid := map[string]time.Duration{"60s": time.Minute, "5m": 5 * time.Minute, "1h30m": 90 * time.Minute,
		"60": time.Minute, "0": 0, "1500ms": 1500 * time.Millisecond, "9223372036": 9223372036 * time.Second}
	for s, want := range valid {
		got, err := ParseDuration(s)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "-5s", "-5", "1.5", "5 m", "soon", "9223372037", "99999999999999999999"} {
		if got, err := ParseDuration(s); !errors.Is(err, ErrBadQuantity) {
			t.Errorf("ParseDuration(%q) = %v, %v; want ErrBadQuantity", s, got, err)
		}
	}
}

func TestFormatRoundTrip(t *testing.T) {
	for _, q := range []Quantity{0, 1, 1000, 512 * mi, 1536 * mi, 4 * gi, 4e9, 1<<63 - 1, 7 << 60} {
		s := FormatBytes(q)
		back, err := ParseBytes(s)
		if err != nil || back != q {
			t.Errorf("FormatBytes(%d) = %q, parses back to %d, %v", q, s, back, err)
		}
	}
	if s := FormatBytes(512 * mi); s != "512Mi" {
		t.Errorf("FormatBytes(512Mi) = %q", s)
	}
	for _, q := range []Quantity{1, 500, 1000, 1500, 4000} {
		s := FormatCPUs(q)
		back, err := ParseCPUs(s)
		if err != nil || back != q {
			t.Errorf("FormatCPUs(%d) = %q, parses back to %d, %v", q, s, back, err)
		}
	}
}

// TestMarshalRoundTrip: what `str profile show` prints decodes back to
// the same profile.
func TestMarshalRoundTrip(t *testing.T) {
	s := mustEmbedded(t)
	for _, name := range s.Names() {
		p := mustLookup(t, s, name)
		out, err := yaml.Marshal(p)
		if err != nil {
			t.Fatalf("%s: Marshal: %v", name, err)
		}
		back, err := Decode(out, name+" (marshalled)")
		if err != nil {
			t.Fatalf("%s: Decode of marshalled profile: %v\n%s", name, err, out)
		}
		if !reflect.DeepEqual(back, p) {
			t.Errorf("%s: round trip changed the profile:\n%s", name, out)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestTighten(t *testing.T) {
	s := mustEmbedded(t)
	tests := []struct {
		name    string
		profile string
		o       Overrides
		check   func(*Profile) bool
		errs    []string // each must appear; nil = success
	}{
		{"no overrides", "standard", Overrides{}, func(p *Profile) bool { return p.Cgroup.Memory == 1*gi }, nil},
		{"equal values", "restrictive", Overrides{Timeout: ptr(60 * time.Second), Memory: ptr(Quantity(512 * mi)), CPUs: ptr(Quantity(1000)), Pids: ptr(int64(32)), Network: ptr("none")},
			func(p *Profile) bool { return p.Cgroup.Memory == 512*mi && p.Network == "none" }, nil},
		{"all tighter", "standard", Overrides{Timeout: ptr(10 * time.Second), Memory: ptr(Quantity(256 * mi)), CPUs: ptr(Quantity(500)), Pids: ptr(int64(8)), Network: ptr("none")},
			func(p *Profile) bool {
				return p.Timeout == Duration(10*time.Second) && p.Cgroup.Memory == 256*mi && p.Rlimits.AS == AddressSpace(1*gi) &&
					p.Cgroup.CPUs == 500 && p.Cgroup.Pids == 8 && p.Network == "none"
			}, nil},
		{"memory looser", "restrictive", Overrides{Memory: ptr(Quantity(2 * gi))}, nil,
			[]string{"profile restrictive: memory 2Gi asked, at most 512Mi allowed (overrides may only tighten)"}},
		{"network looser", "restrictive", Overrides{Network: ptr("host")}, nil,
			[]string{`profile restrictive: network "host" asked, only "none" allowed (overrides may only tighten)`}},
		{"network looser on confidential", "confidential", Overrides{Network: ptr("host")}, nil, []string{`network "host" asked`}},
		{"timeout looser", "permissive", Overrides{Timeout: ptr(11 * time.Minute)}, nil,
			[]string{"profile permissive: timeout 11m0s asked, at most 10m0s allowed"}},
		{"cpus looser", "standard", Overrides{CPUs: ptr(Quantity(2500))}, nil, []string{"cpus 2500m asked, at most 2 allowed"}},
		{"pids looser", "standard", Overrides{Pids: ptr(int64(129))}, nil, []string{"pids 129 asked, at most 128 allowed"}},
		{"several looser collected", "restrictive",
			Overrides{Timeout: ptr(time.Hour), Memory: ptr(Quantity(1 * gi)), CPUs: ptr(Quantity(2000)), Pids: ptr(int64(1000)), Network: ptr("host")}, nil,
			[]string{"timeout 1h0m0s asked", "memory 1Gi asked", "cpus 2 asked", "pids 1000 asked", `network "host" asked`}},
		{"invalid values", "standard", Overrides{Timeout: ptr(time.Duration(0)), Memory: ptr(Quantity(0)), CPUs: ptr(Quantity(-1)), Pids: ptr(int64(0)), Network: ptr("bridge")}, nil,
			[]string{"timeout (override): must be > 0", "memory (override): must be > 0", "cpus (override): must be > 0", "pids (override): must be > 0", `network (override): "bridge" is not one of none, host`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustLookup(t, s, tt.profile)
			before := mustLookup(t, s, tt.profile)
			got, err := p.Tighten(tt.o)
			if !reflect.DeepEqual(p, before) {
				t.Errorf("Tighten changed its receiver")
			}
			if tt.errs == nil {
				if err != nil {
					t.Fatalf("Tighten: %v", err)
				}
				if !tt.check(got) {
					t.Errorf("Tighten result wrong: %+v", got)
				}
				return
			}
			if err == nil {
				t.Fatalf("Tighten succeeded: %+v", got)
			}
			for _, w := range tt.errs {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
			if n := strings.Count(err.Error(), "\n") + 1; n != len(tt.errs) {
				t.Errorf("%d problems reported, want %d:\n%v", n, len(tt.errs), err)
			}
		})
	}
}

func TestTightenErrorTypes(t *testing.T) {
	p := mustLookup(t, mustEmbedded(t), "restrictive")
	_, err := p.Tighten(Overrides{Memory: ptr(Quantity(2 * gi))})
	var le *LoosenError
	if !errors.Is(err, ErrLoosening) || !errors.As(err, &le) || le.Field != "memory" || le.Asked != "2Gi" {
		t.Errorf("err = %v (%#v)", err, le)
	}
	_, err = p.Tighten(Overrides{Network: ptr("bridge")})
	if errors.Is(err, ErrLoosening) || len(fieldErrors(err)) != 1 {
		t.Errorf("invalid network: err = %v, want one FieldError and no ErrLoosening", err)
	}
}

func TestTightenUnlimitedTimeout(t *testing.T) {
	p := mustLookup(t, mustEmbedded(t), "standard")
	p.Timeout = 0 // no timeout: any positive timeout tightens
	got, err := p.Tighten(Overrides{Timeout: ptr(24 * time.Hour)})
	if err != nil || got.Timeout != Duration(24*time.Hour) {
		t.Errorf("Tighten = %+v, %v", got, err)
	}
}

func TestTightenDeepCopy(t *testing.T) {
	p := mustLookup(t, mustEmbedded(t), "standard")
	got, err := p.Tighten(Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	got.Env.Set["PATH"] = "x"
	got.Mounts.ReadOnly[0].Path = "/x"
	got.Mounts.Tmpfs[0].Size = 1
	got.Env.Passthrough[0] = "X"
	if p.Env.Set["PATH"] == "x" || p.Mounts.ReadOnly[0].Path == "/x" || p.Mounts.Tmpfs[0].Size == 1 || p.Env.Passthrough[0] == "X" {
		t.Error("Tighten's result shares memory with its receiver")
	}
}

func writeFile(t *testing.T, dir, name, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDirGood(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "extra.yaml", validYAML)
	writeFile(t, dir, "README.md", "not a profile")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := mustEmbedded(t)
	if err := s.LoadDir(dir); err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if got := mustLookup(t, s, "extra-alias").Name; got != "extra" {
		t.Errorf("Lookup(extra-alias).Name = %q", got)
	}
	if got := s.Names(); !slices.Equal(got, []string{"confidential", "extra", "permissive", "restrictive", "standard"}) {
		t.Errorf("Names() = %v", got)
	}
	if got := s.Source("extra"); got != filepath.Join(dir, "extra.yaml") {
		t.Errorf("Source(extra) = %q", got)
	}
	// A new embedded set is not affected.
	if _, err := mustEmbedded(t).Lookup("extra"); !errors.Is(err, ErrUnknownProfile) {
		t.Errorf("fresh Embedded() sees a LoadDir profile: %v", err)
	}
}

func TestLoadDirBadFilesAllReportedNothingAdded(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "good.yaml", strings.NewReplacer("name: extra", "name: good", "[extra-alias]", "[]").Replace(validYAML))
	writeFile(t, dir, "bad1.yaml", strings.NewReplacer("name: extra", "name: bad1", "[extra-alias]", "[]", "uid: 1000", "uid: 0").Replace(validYAML))
	writeFile(t, dir, "bad2.yaml", "version: 1\nname: bad2\nnetwork: sideways\nfoo: 1\n")
	writeFile(t, dir, "misnamed.yaml", strings.NewReplacer("[extra-alias]", "[]").Replace(validYAML)) // holds "extra"
	s := mustEmbedded(t)
	err := s.LoadDir(dir)
	if err == nil {
		t.Fatal("LoadDir succeeded")
	}
	msg := err.Error()
	for _, want := range []string{
		filepath.Join(dir, "bad1.yaml") + ": profile bad1: uid: must be set and not 0",
		filepath.Join(dir, "bad2.yaml") + ": ",
		"field foo not found",
		filepath.Join(dir, "misnamed.yaml") + `: holds profile "extra"`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not contain %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "good.yaml") {
		t.Errorf("error mentions the good file:\n%s", msg)
	}
	if _, err := s.Lookup("good"); !errors.Is(err, ErrUnknownProfile) {
		t.Errorf("a failed LoadDir added the good profile: %v", err)
	}
}

func TestLoadDirCollisions(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"name of an embedded profile", map[string]string{
			"standard.yaml": strings.NewReplacer("name: extra", "name: standard", "[extra-alias]", "[]").Replace(validYAML)},
			[]string{`"standard" is already the name of profile standard (from embedded:standard.yaml)`}},
		{"name equal to an embedded alias", map[string]string{
			"trusted.yaml": strings.NewReplacer("name: extra", "name: trusted", "[extra-alias]", "[]").Replace(validYAML)},
			[]string{`"trusted" is already the alias of profile permissive`}},
		{"alias equal to an embedded name and alias", map[string]string{
			"extra.yaml": strings.Replace(validYAML, "[extra-alias]", "[restrictive, untrusted]", 1)},
			[]string{`"restrictive" is already the name of profile restrictive`, `"untrusted" is already the alias of profile restrictive`}},
		{"two new files share an alias", map[string]string{
			"extra.yaml": validYAML,
			"other.yaml": strings.Replace(validYAML, "name: extra", "name: other", 1)},
			[]string{`other.yaml: profile other: "extra-alias" is already the alias of profile extra`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tt.files {
				writeFile(t, dir, name, data)
			}
			s := mustEmbedded(t)
			err := s.LoadDir(dir)
			if !errors.Is(err, ErrDuplicateProfile) {
				t.Fatalf("LoadDir = %v, want ErrDuplicateProfile", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
			// Nothing changed.
			if got := s.Names(); !slices.Equal(got, []string{"confidential", "permissive", "restrictive", "standard"}) {
				t.Errorf("Names() after failed LoadDir = %v", got)
			}
			if got := mustLookup(t, s, "trusted").Name; got != "permissive" {
				t.Errorf("trusted now resolves to %s", got)
			}
		})
	}
}

func TestLoadDirMissing(t *testing.T) {
	s := mustEmbedded(t)
	missing := filepath.Join(t.TempDir(), "nope")
	err := s.LoadDir(missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("LoadDir(missing) = %v", err)
	}
}

// A lookup by name decodes that file alone; it gives exactly the profile
// the full load gives, and aliases still resolve.
func TestLazyEmbeddedLookup(t *testing.T) {
	lazy, _ := Embedded()
	p, err := lazy.Lookup("restrictive")
	if err != nil {
		t.Fatal(err)
	}
	if lazy.pending == nil || len(lazy.single) != 1 {
		t.Fatalf("a lookup by name decoded the whole set (pending %v, single %d)", lazy.pending != nil, len(lazy.single))
	}
	full, _ := Embedded()
	if err := full.loadAll(); err != nil {
		t.Fatal(err)
	}
	q, _ := full.Lookup("restrictive")
	if !reflect.DeepEqual(p, q) {
		t.Fatalf("lazy and full decode differ:\n%+v\n%+v", p, q)
	}
	if a, err := lazy.Lookup("untrusted"); err != nil || a.Name != "restrictive" {
		t.Fatalf("alias after a lazy lookup: %v %v", a, err)
	}
}

// rlimits.as may be "unlimited" (memory.max bounds the sandbox), never in a
// best_effort profile (which may run without a cgroup); no other size may.
func TestAddressSpaceUnlimited(t *testing.T) {
	base, err := embedded.ReadFile("restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(base), "as: 512Mi", "as: unlimited", 1)
	p, err := Decode([]byte(src), "t.yaml")
	if err != nil || p.Rlimits.AS != UnlimitedAS || p.Rlimits.AS.Rlimit() != math.MaxUint64 {
		t.Fatalf("as: unlimited: %v %v", p, err)
	}
	if _, err := Decode([]byte(strings.Replace(src, "best_effort: false", "best_effort: true", 1)), "t.yaml"); err == nil || !strings.Contains(err.Error(), "rlimits.as") {
		t.Fatalf("unlimited address space in a best_effort profile: %v", err)
	}
	if _, err := Decode([]byte(strings.Replace(string(base), "fsize: 64Mi", "fsize: unlimited", 1)), "t.yaml"); err == nil {
		t.Fatal("fsize: unlimited accepted")
	}
}
