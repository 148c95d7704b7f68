package profiles

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrBadQuantity is wrapped by every error of ParseBytes, ParseCPUs and
// ParseDuration.
var ErrBadQuantity = errors.New("bad quantity")

// maxQuantityLen bounds the text a quantity may have; anything longer is
// garbage, and the bound keeps big-number arithmetic cheap.
const maxQuantityLen = 40

// byteSuffixes are the Kubernetes suffixes accepted for byte sizes. There
// is no "m" (milli) suffix: a fraction of a byte is meaningless.
var byteSuffixes = map[string]int64{
	"":   1,
	"k":  1e3,
	"M":  1e6,
	"G":  1e9,
	"T":  1e12,
	"P":  1e15,
	"E":  1e18,
	"Ki": 1 << 10,
	"Mi": 1 << 20,
	"Gi": 1 << 30,
	"Ti": 1 << 40,
	"Pi": 1 << 50,
	"Ei": 1 << 60,
}

// binaryUnits, largest first, are used by FormatBytes.
var binaryUnits = []struct {
	suffix string
	size   int64
}{
	{"Ei", 1 << 60}, {"Pi", 1 << 50}, {"Ti", 1 << 40},
	{"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10},
}

// ParseBytes parses a byte size in Kubernetes notation: a plain integer
// ("1000"), a decimal SI suffix (k, M, G, T, P, E: "4G"), or a binary
// suffix (Ki, Mi, Gi, Ti, Pi, Ei: "512Mi"). A decimal fraction is allowed
// when the result is a whole number of bytes ("1.5Gi"). Signs, exponents,
// spaces, unknown suffixes and values above math.MaxInt64 are rejected.
func ParseBytes(s string) (Quantity, error) {
	n, err := parseScaled(s, byteSuffixes, "bytes")
	return Quantity(n), err
}

// ParseCPUs parses a CPU count into milli-CPUs: "2" -> 2000, "1.5" ->
// 1500, "500m" -> 500. A result that is not a whole number of milli-CPUs
// ("0.0005") is rejected, as are signs and unknown suffixes.
func ParseCPUs(s string) (Quantity, error) {
	n, err := parseScaled(s, map[string]int64{"": 1000, "m": 1}, "CPUs")
	return Quantity(n), err
}

// parseScaled parses "<digits>[.<digits>]<suffix>" and returns the value
// times suffixes[suffix], which must be a whole number no larger than
// math.MaxInt64.
func parseScaled(s string, suffixes map[string]int64, kind string) (int64, error) {
	bad := func(why string) (int64, error) {
		return 0, fmt.Errorf("%w: %q as %s: %s", ErrBadQuantity, s, kind, why)
	}
	switch {
	case s == "":
		return bad("empty")
	case len(s) > maxQuantityLen:
		return bad(fmt.Sprintf("longer than %d characters", maxQuantityLen))
	case s[0] == '-':
		return bad("negative values are not allowed")
	}
	// 1. Split the text into integer digits, fraction digits and suffix.
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intPart := s[:i]
	fracPart := ""
	if i < len(s) && s[i] == '.' {
		j := i + 1
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		fracPart = s[i+1 : j]
		if fracPart == "" {
			return bad("no digits after the decimal point")
		}
		i = j
	}
	if intPart == "" {
		return bad("must start with a digit")
	}
	suffix := s[i:]
	mult, ok := suffixes[suffix]
	if !ok {
		valid := make([]string, 0, len(suffixes))
		for k := range suffixes {
			if k != "" {
				valid = append(valid, k)
			}
		}
		slices.Sort(valid)
		return bad(fmt.Sprintf("unknown suffix %q (valid: none, %s)", suffix, strings.Join(valid, ", ")))
	}
	// 2. value = (int.frac) * mult, computed exactly.
	num, _ := new(big.Int).SetString(intPart+fracPart, 10)
	den := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(fracPart))), nil)
	num.Mul(num, big.NewInt(mult))
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if r.Sign() != 0 {
		if kind == "CPUs" {
			return bad("not a whole number of milli-CPUs")
		}
		return bad("not a whole number of bytes")
	}
	if !q.IsInt64() {
		return bad("too large")
	}
	return q.Int64(), nil
}

// ParseDuration parses a Go duration ("60s", "5m", "1h30m") or a bare
// integer number of seconds ("60"). Negative durations are rejected.
func ParseDuration(s string) (time.Duration, error) {
	bad := func(why string) (time.Duration, error) {
		return 0, fmt.Errorf("%w: %q as duration: %s", ErrBadQuantity, s, why)
	}
	if s == "" {
		return bad("empty")
	}
	if strings.Trim(s, "0123456789") == "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n > math.MaxInt64/int64(time.Second) {
			return bad("too large")
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return bad(strings.TrimPrefix(err.Error(), "time: "))
	}
	if d < 0 {
		return bad("negative durations are not allowed")
	}
	return d, nil
}

// FormatBytes prints a byte size with the largest binary suffix that
// divides it exactly ("512Mi"), or as a plain integer. ParseBytes reads
// the result back to the same value.
func FormatBytes(q Quantity) string {
	if q > 0 {
		for _, u := range binaryUnits {
			if int64(q)%u.size == 0 {
				return strconv.FormatInt(int64(q)/u.size, 10) + u.suffix
			}
		}
	}
	return strconv.FormatInt(int64(q), 10)
}

// FormatCPUs prints milli-CPUs as whole CPUs ("2") when exact, otherwise
// in milli notation ("1500m"). ParseCPUs reads the result back.
func FormatCPUs(q Quantity) string {
	if q%1000 == 0 {
		return strconv.FormatInt(int64(q)/1000, 10)
	}
	return strconv.FormatInt(int64(q), 10) + "m"
}

// String prints the quantity as a byte size (see FormatBytes).
func (q Quantity) String() string { return FormatBytes(q) }

// String prints the duration as Go does ("1m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// AddressSpace is rlimits.as: a byte size, or "unlimited". RLIMIT_AS
// caps each process's virtual address space, which runtimes reserve far
// beyond what they use: a Go or JVM program cannot even start under the
// reference's 512 MiB although it needs 20 MB. Where memory.max bounds
// the sandbox's real memory (always, unless best_effort), a profile may
// therefore lift the address-space limit; the reference's numbers stay
// the default of the embedded profiles for compatibility.
type AddressSpace Quantity

// UnlimitedAS is rlimits.as: unlimited (RLIM_INFINITY).
const UnlimitedAS = AddressSpace(math.MaxInt64)

func (a AddressSpace) String() string {
	if a == UnlimitedAS {
		return "unlimited"
	}
	return FormatBytes(Quantity(a))
}

// Rlimit is the value setrlimit takes: RLIM_INFINITY for unlimited.
func (a AddressSpace) Rlimit() uint64 {
	if a == UnlimitedAS {
		return math.MaxUint64
	}
	return uint64(a)
}
