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
