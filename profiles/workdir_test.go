package profiles

import (
	"errors"
	"strings"
	"testing"
)

// Every embedded profile caps the work dir in bytes and inodes, with the
// documented defaults (confidential as restrictive).
func TestWorkDirDefaults(t *testing.T) {
	s := mustEmbedded(t)
	want := map[string]WorkDir{
		"restrictive":  {Size: 256 * mi, Inodes: 65536},
		"confidential": {Size: 256 * mi, Inodes: 65536},
		"standard":     {Size: 1 * gi, Inodes: 262144},
		"permissive":   {Size: 4 * gi, Inodes: 1048576},
	}
	for name, w := range want {
		p, err := s.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if p.WorkDir != w {
			t.Errorf("%s: work_dir %+v, want %+v", name, p.WorkDir, w)
		}
	}
}

// A profile without work_dir, or with a zero cap, does not load: an
// uncapped work dir is a host directory a tool can fill.
func TestWorkDirRequired(t *testing.T) {
	for _, tc := range []struct{ name, yaml, field string }{
		{"missing", strings.Replace(validYAML, "work_dir: {size: 64Mi, inodes: 1000}\n", "", 1), "work_dir.size"},
		{"no inodes", strings.Replace(validYAML, "work_dir: {size: 64Mi, inodes: 1000}", "work_dir: {size: 64Mi}", 1), "work_dir.inodes"},
		{"zero size", strings.Replace(validYAML, "work_dir: {size: 64Mi, inodes: 1000}", "work_dir: {size: 0, inodes: 5}", 1), "work_dir.size"},
	} {
		_, err := Decode([]byte(tc.yaml), "x.yaml")
		if err == nil {
			t.Errorf("%s: decoded", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.field+": must be set and > 0") {
			t.Errorf("%s: error %v does not name %s", tc.name, err, tc.field)
		}
	}
	// Unknown keys under work_dir are decode errors, like everywhere.
	y := strings.Replace(validYAML, "work_dir: {size: 64Mi, inodes: 1000}", "work_dir: {size: 64Mi, inodes: 1000, quota: 1}", 1)
	if _, err := Decode([]byte(y), "x.yaml"); err == nil || !strings.Contains(err.Error(), "quota") {
		t.Errorf("unknown work_dir key: %v", err)
	}
	p, err := Decode([]byte(validYAML), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.WorkDir != (WorkDir{Size: 64 * mi, Inodes: 1000}) {
		t.Errorf("decoded work_dir %+v", p.WorkDir)
	}
}

// The work dir caps, like every limit, may only be tightened.
func TestTightenWorkDir(t *testing.T) {
	s := mustEmbedded(t)
	p, err := s.Lookup("restrictive")
	if err != nil {
		t.Fatal(err)
	}
	tight, err := p.Tighten(Overrides{WorkDirSize: ptr(Quantity(16 * mi)), WorkDirInodes: ptr(int64(100))})
	if err != nil {
		t.Fatal(err)
	}
	if tight.WorkDir != (WorkDir{Size: 16 * mi, Inodes: 100}) || p.WorkDir.Size != 256*mi {
		t.Errorf("tightened %+v, original %+v", tight.WorkDir, p.WorkDir)
	}
	_, err = p.Tighten(Overrides{WorkDirSize: ptr(Quantity(1 * gi)), WorkDirInodes: ptr(int64(1 << 20))})
	if !errors.Is(err, ErrLoosening) {
		t.Fatalf("loosening accepted: %v", err)
	}
	for _, want := range []string{"work_dir.size 1Gi asked, at most 256Mi allowed", "work_dir.inodes 1048576 asked, at most 65536 allowed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	_, err = p.Tighten(Overrides{WorkDirSize: ptr(Quantity(0)), WorkDirInodes: ptr(int64(-1))})
	var fe *FieldError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "work_dir.size (override): must be > 0") || !strings.Contains(err.Error(), "work_dir.inodes (override)") {
		t.Errorf("invalid overrides: %v", err)
	}
}
