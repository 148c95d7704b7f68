package artifacts

import (
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzLocate feeds arbitrary user ids, session ids, filenames and
// namespaces (seeds in testdata/fuzz/FuzzLocate: traversal, NUL, "user:"
// tricks and NFKC look-alikes such as fullwidth dots and solidi) to the
// name rules and the filesystem store's path building. Besides that
// nothing panics it checks that:
//   - an accepted name's artifact directory, and every file the store
//     makes in it, is inside the store's scope directory under the base
//     (filepath.Rel), exactly {user}/{session or "user"}/{name} below it;
//   - each of those components is one safe path component, as given and
//     NFKC-normalised;
//   - CheckFilename agrees with locate, and accepts nothing whose NFKC
//     form is unsafe;
//   - the artifact is user-scoped exactly when its NFKC form starts with
//     "user:", and always when the name as given does;
//   - a namespace's scope is one component inside the base.
func FuzzLocate(f *testing.F) {
	base := f.TempDir()
	st, err := NewFilesystem(base, "sam/artifacts/")
	if err != nil {
		f.Fatal(err)
	}
	store := st.(*fsStore)
	f.Fuzz(func(t *testing.T, userID, sessionID, filename, namespace string) {
		loc, err := locate(userID, sessionID, filename)
		nameErr := CheckFilename(filename)
		if nameErr != nil && err == nil {
			t.Fatalf("locate accepted %q, which CheckFilename refuses: %v", filename, nameErr)
		}
		if nameErr == nil {
			for _, form := range []string{filename, norm.NFKC.String(filename)} {
				if why := fuzzUnsafe(strings.TrimPrefix(form, UserPrefix), true); why != "" {
					t.Fatalf("CheckFilename accepted %q: %q is %s", filename, form, why)
				}
			}
		}
		if err == nil {
			checkLocation(t, store, base, userID, sessionID, filename, loc)
		}

		if scope, err := Scope(namespace); err == nil {
			if why := fuzzUnsafe(scope, false); why != "" {
				t.Fatalf("namespace %q: scope %q is %s", namespace, scope, why)
			}
			inside(t, base, filepath.Join(base, scope), 1)
		}
	})
}

func checkLocation(t *testing.T, store *fsStore, base, userID, sessionID, filename string, loc location) {
	t.Helper()
	nfkc := norm.NFKC.String(filename)
	userScoped := strings.HasPrefix(nfkc, UserPrefix)
	if strings.HasPrefix(filename, UserPrefix) && !userScoped {
		t.Fatalf("%q starts with %q but its NFKC form %q does not", filename, UserPrefix, nfkc)
	}
	want := []string{userID, sessionID, nfkc}
	if userScoped {
		want = []string{userID, userScopeDir, strings.TrimPrefix(nfkc, UserPrefix)}
	} else if sessionID == userScopeDir {
		t.Fatalf("session id %q accepted for %q", sessionID, filename)
	}
	if loc.filename != nfkc || strings.Join(loc.rel, "\x00") != strings.Join(want, "\x00") {
		t.Fatalf("(%q, %q, %q) located at %q as %q, want %q", userID, sessionID, filename, loc.rel, loc.filename, want)
	}
	for i, c := range loc.rel {
		if why := fuzzUnsafe(c, i == 2); why != "" {
			t.Fatalf("(%q, %q, %q): component %q is %s", userID, sessionID, filename, c, why)
		}
	}
	dir := store.dir(loc)
	inside(t, store.root, dir, 3)
	inside(t, base, dir, 4)
	for _, f := range []string{"0", "0" + MetaSuffix, lockFileName} {
		inside(t, store.root, filepath.Join(dir, f), 4)
	}
}

// inside fails unless path is exactly depth components below dir.
func inside(t *testing.T, dir, path string, depth int) {
	t.Helper()
	rel, err := filepath.Rel(dir, path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		t.Fatalf("%q escapes %q (rel %q, %v)", path, dir, rel, err)
	}
	if n := len(strings.Split(rel, "/")); n != depth {
		t.Fatalf("%q is %d components below %q, want %d", path, n, dir, depth)
	}
}

// fuzzUnsafe says why s is not one safe path component, written apart
// from CheckName and CheckFilename. Filenames (filename) may not contain
// control characters either; ids may (CheckName refuses only NUL, the
// request parser the rest), which cannot make a path escape.
func fuzzUnsafe(s string, filename bool) string {
	switch {
	case s == "" || s == "." || s == "..":
		return "empty or a directory reference"
	case !utf8.ValidString(s):
		return "invalid UTF-8"
	case strings.ContainsAny(s, "/\\\x00"):
		return "a path with a separator or NUL"
	case len(s) > MaxNameBytes:
		return "too long"
	}
	if filename && strings.ContainsFunc(s, unicode.IsControl) {
		return "a name with a control character"
	}
	return ""
}
