package launcher

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/launcher/initbin"
)

// When the kernel refuses to execute the init's cached copy (an LSM that
// denies a file on a detached mount, say; here a copy without execute
// bits, which even root may not execute), the sandbox still runs: its
// init is executed from the sealed memfd instead, and so are the
// process's later sandboxes. In a child process of the test, whose
// process-wide copy is a planted one (initbin.Cached keeps the first).
func TestInitCopyRefusedFallsBackToMemfd(t *testing.T) {
	if os.Geteuid() != 0 {
		const why = "the init's cached copy and a root-mode sandbox need root"
		mustwork.Skip(t, why)
	}
	if dir := os.Getenv("STR_TEST_INIT_COPY_DIR"); dir != "" {
		os.Exit(initCopyRefusedChild(dir))
	}
	dir := filepath.Join(t.TempDir(), "init")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, initbin.CachedName()), initbin.Binary, 0o444); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInitCopyRefusedFallsBackToMemfd$", "-test.count=1")
	// STR_INIT=exec: a direct sandbox never executes the init.
	cmd.Env = append(os.Environ(), "STR_TEST_INIT_COPY_DIR="+dir, "STR_INIT=exec")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "refused to execute the init's cached copy") {
		t.Fatalf("no warning about the refused copy:\n%s", out)
	}
}

func initCopyRefusedChild(dir string) int {
	if _, err := initbin.Cached(dir); err != nil {
		fmt.Println("planted copy refused:", err)
		return 1
	}
	l, err := New(Options{Logger: slog.New(slog.NewTextHandler(os.Stdout, nil))})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	for i := range 2 {
		res, err := l.Run(context.Background(), Request{Profile: "restrictive", Argv: []string{"/bin/true"}})
		if err != nil || res.SetupError != nil || res.ExitCode != 0 {
			fmt.Printf("sandbox %d: %v %+v\n", i, err, res)
			return 1
		}
		if !initCopyRefused.Load() {
			fmt.Printf("sandbox %d ran, but not after a refused copy: the planted copy executed?\n", i)
			return 1
		}
	}
	return 0
}
