package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
