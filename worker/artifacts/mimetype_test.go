package artifacts

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestCheckMimeType(t *testing.T) {
	for _, ok := range []string{
		"text/plain", "application/json", "image/svg+xml", "application/vnd.ms-excel",
		"text/plain; charset=utf-8", `text/plain;charset="utf-8"`, "application/x.y_z-1", "A/B",
		strings.Repeat("a", 127) + "/" + strings.Repeat("b", 127),
	} {
		if err := CheckMimeType(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{
		"", "text", "text/", "/plain", "text/plain/x", "text /plain", "-text/plain", "text/pl ain",
		"text/plain\n", "text/plain\x00", "tëxt/plain", "text/plain;", "text/plain; charset", "text/plain; =x",
		strings.Repeat("a", 128) + "/b",
		"text/" + strings.Repeat("x", 1<<20), // a megabyte
		"text/plain; x=" + strings.Repeat("y", 250),
	} {
		err := CheckMimeType(bad)
		if !errors.Is(err, ErrBadMimeType) {
			t.Errorf("%.40q accepted (%v)", bad, err)
			continue
		}
		if len(err.Error()) > 300 {
			t.Errorf("the error repeats the whole value: %d bytes", len(err.Error()))
		}
	}
}

// Both stores refuse a mime type that breaks the rule, and keep nothing.
func TestSaveRefusesBadMimeType(t *testing.T) {
	ctx := context.Background()
	for name, s := range stores(t) {
		_, err := s.Save(ctx, "u", "s", "a.txt", []byte("x"), "text/"+strings.Repeat("x", 1<<20))
		if !errors.Is(err, ErrBadMimeType) {
			t.Errorf("%s: megabyte mime type: %v", name, err)
		}
		if vs, _ := s.ListVersions(ctx, "u", "s", "a.txt"); len(vs) != 0 {
			t.Errorf("%s: versions stored after a refusal: %v", name, vs)
		}
		if _, err := s.Save(ctx, "u", "s", "a.txt", []byte("x"), "text/plain; charset=utf-8"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
