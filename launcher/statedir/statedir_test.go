package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestDir(t *testing.T) {
	if got := Dir(env(map[string]string{Env: "/var/lib/str/state/"})); got != "/var/lib/str/state" {
		t.Errorf("Dir with %s set: %s", Env, got)
	}
	if os.Geteuid() == 0 {
		if got := Dir(env(nil)); got != RootDefault {
			t.Errorf("Dir as root: %s, want %s", got, RootDefault)
		}
	} else if got := Dir(env(map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000"})); got != "/run/user/1000/str" {
		t.Errorf("Dir with XDG_RUNTIME_DIR: %s", got)
	}
	if err := Check(env(map[string]string{Env: "state"})); err == nil || !strings.Contains(err.Error(), "state directory state (STR_STATE_DIR): not an absolute path") {
		t.Errorf("Check of a relative %s: %v", Env, err)
	}
}

// A state directory that cannot be created (here: below a regular file,
// as under a read-only root it cannot) is an *Error naming the directory
// and the setting.
func TestSubError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Sub(file, "ids")
	var se *Error
	if !errors.As(err, &se) || se.Dir != filepath.Join(file, "ids") ||
		!strings.Contains(err.Error(), "state directory "+file+"/ids (STR_STATE_DIR): ") {
		t.Fatalf("Sub below a file: %v", err)
	}
	dir := t.TempDir()
	if p, err := Sub(dir, "ids"); err != nil || p != filepath.Join(dir, "ids") {
		t.Fatalf("Sub: %s %v", p, err)
	}
}

// TestSubRefusesUnsafeDir: issue 29, item 2's audit. The state directory
// must be the euid's and writable by no one else, checked by Sub (every
// id lease, cgroup lock and init copy goes through it): another uid's
// directory, a sticky shared one and a symlink are refused, unchanged,
// with an error naming the directory, its owner and mode; the euid's own
// directory that others may write (an emptyDir: 0777) loses its group
// and other write bits, and then a subdirectory another uid planted there
// is refused.
func TestSubRefusesUnsafeDir(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "needs root: the directories belong to another uid")
	}
	mk := func(uid int, perm os.FileMode) string {
		d := filepath.Join(t.TempDir(), "state")
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, perm); err != nil {
			t.Fatal(err)
		}
		return d
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(mk(0, 0o700), link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir  string
		want string
	}{
		{mk(1234, 0o700), "is owned by uid 1234 with mode 0700: it must be owned by uid 0"},
		{mk(0, 0o777|os.ModeSticky), "is owned by uid 0 with mode 1777"},
		{link, "is not a directory"},
	} {
		before, _ := os.Lstat(c.dir)
		_, err := Sub(c.dir, "ids")
		var ue *UnsafeDirError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.dir+" "+c.want) {
			t.Errorf("Sub(%s): %v, want an UnsafeDirError %q", c.dir, err, c.want)
		}
		if after, _ := os.Lstat(c.dir); after.Mode() != before.Mode() {
			t.Errorf("%s: mode changed %v -> %v", c.dir, before.Mode(), after.Mode())
		}
	}

	// The euid's own, writable by others: tightened.
	d := mk(0, 0o777)
	if p, err := Sub(d, "ids"); err != nil || p != filepath.Join(d, "ids") {
		t.Fatalf("Sub of root's 0777 directory: %s %v", p, err)
	}
	if fi, _ := os.Lstat(d); fi.Mode().Perm() != 0o755 {
		t.Errorf("root's 0777 state directory is %o after Sub, want 0755", fi.Mode().Perm())
	}
	// ... and what another uid planted there while it was open is refused.
	d = mk(0, 0o777)
	if err := os.Mkdir(filepath.Join(d, "ids"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(d, "ids"), 1234, 1234); err != nil {
		t.Fatal(err)
	}
	if _, err := Sub(d, "ids"); err == nil || !strings.Contains(err.Error(), filepath.Join(d, "ids")+" is owned by uid 1234") {
		t.Errorf("Sub with a planted ids/: %v", err)
	}
}

// TestHintFor: an unsafe state directory's fix names its owner and the
// setting, not writability.
func TestHintFor(t *testing.T) {
	err := &Error{Dir: "/s", Err: &UnsafeDirError{Dir: "/s", Owner: 1234, Mode: 0o40755, Want: 0}}
	if h := HintFor("/s", err); !strings.Contains(h, "give /s to uid 0 alone") || !strings.Contains(h, Env) {
		t.Errorf("HintFor an unsafe dir: %q", h)
	}
	if h := HintFor("/s", &Error{Dir: "/s", Err: os.ErrPermission}); h != Hint("/s") {
		t.Errorf("HintFor another error: %q", h)
	}
}
