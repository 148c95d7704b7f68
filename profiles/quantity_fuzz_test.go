package profiles

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParseQuantity feeds arbitrary text (seeds in
// testdata/fuzz/FuzzParseQuantity) to ParseBytes, ParseCPUs and
// ParseDuration, and an arbitrary number to the formatters. Besides that
// nothing panics it checks that every refusal wraps ErrBadQuantity, no
// accepted value is negative, FormatBytes and FormatCPUs (and
// Duration.String) print what parses back to the same value, a bare
// integer means bytes, CPUs or seconds as strconv reads it, and the
// suffixes scale exactly ("xKi" is 1024 times "x", "x" is 1000 times
// "xm" CPUs).
func FuzzParseQuantity(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string, n int64) {
		b, err := ParseBytes(s)
		checkQuantityErr(t, "ParseBytes", s, err)
		if err == nil {
			if b < 0 {
				t.Fatalf("ParseBytes(%q) = %d", s, b)
			}
			roundTripBytes(t, b)
			if k, err := ParseBytes(s + "Ki"); err == nil && b <= math.MaxInt64/1024 && k != b*1024 {
				t.Fatalf("ParseBytes(%q) = %d but ParseBytes(%q) = %d", s, b, s+"Ki", k)
			}
		}
		if isDigits(s) && len(s) <= maxQuantityLen {
			v, perr := strconv.ParseInt(s, 10, 64)
			if (perr == nil) != (err == nil) || (perr == nil && int64(b) != v) {
				t.Fatalf("ParseBytes(%q) = %d, %v; strconv says %d, %v", s, b, err, v, perr)
			}
		}

		c, err := ParseCPUs(s)
		checkQuantityErr(t, "ParseCPUs", s, err)
		if err == nil {
			if c < 0 {
				t.Fatalf("ParseCPUs(%q) = %d", s, c)
			}
			roundTripCPUs(t, c)
			if m, err := ParseCPUs(s + "m"); err == nil && c != m*1000 {
				t.Fatalf("ParseCPUs(%q) = %d but ParseCPUs(%q) = %d, %v", s, c, s+"m", m, err)
			}
		}

		d, err := ParseDuration(s)
		checkQuantityErr(t, "ParseDuration", s, err)
		if err == nil {
			if d < 0 {
				t.Fatalf("ParseDuration(%q) = %s", s, d)
			}
			if back, err := ParseDuration(d.String()); err != nil || back != d {
				t.Fatalf("ParseDuration(%q) = %s, which parses back to %s, %v", s, d, back, err)
			}
			if isDigits(s) {
				if v, err := strconv.ParseInt(s, 10, 64); err != nil || time.Duration(v)*time.Second != d || v > math.MaxInt64/int64(time.Second) {
					t.Fatalf("ParseDuration(%q) = %s; strconv says %d, %v", s, d, v, err)
				}
			}
		}

		if n >= 0 {
			roundTripBytes(t, Quantity(n))
			roundTripCPUs(t, Quantity(n))
		}
	})
}

func checkQuantityErr(t *testing.T, fn, s string, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrBadQuantity) {
		t.Fatalf("%s(%q): %v does not wrap ErrBadQuantity", fn, s, err)
	}
}

func roundTripBytes(t *testing.T, q Quantity) {
	t.Helper()
	s := FormatBytes(q)
	if back, err := ParseBytes(s); err != nil || back != q {
		t.Fatalf("FormatBytes(%d) = %q, which parses back to %d, %v", q, s, back, err)
	}
}

func roundTripCPUs(t *testing.T, q Quantity) {
	t.Helper()
	s := FormatCPUs(q)
	if back, err := ParseCPUs(s); err != nil || back != q {
		t.Fatalf("FormatCPUs(%d) = %q, which parses back to %d, %v", q, s, back, err)
	}
}

func isDigits(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }
