package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/launcher"
	"golang.org/x/sys/unix"
)

const shuffleEnv = "STR_TEST_FD_SHUFFLE_CHILD"

// The init is executed from its memfd by the position the launcher gives
// it among the child's descriptors, so Go's fork-time descriptor shuffle
// (which dups descriptors upwards from the highest one passed, onto
// numbers nobody passed) cannot replace it. The launcher here holds
// descriptors up to 98 and passes the tool one of them and twenty copies
// of a low one: each copy is moved up through 99, 100, ... before it
// lands, which is where a memfd kept at a fixed number (the first free
// one from 100 on, before) was overwritten and the clone failed with
// "fork/exec /proc/self/fd/N: permission denied". Runs the launcher in
// a re-executed child of the test binary, so the test process's own
// descriptors and cgroup stay as they were.
func TestInitExecSurvivesFDShuffle(t *testing.T) {
	if os.Getenv(shuffleEnv) == "1" {
		shuffleChild()
		return
	}
	needRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestInitExecSurvivesFDShuffle$", "-test.count=1")
	cmd.Env = append(os.Environ(), shuffleEnv+"=1", "STR_BIN="+strBin)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"exit_code":0`) {
		t.Fatalf("sandbox with the launcher's descriptors crowded below 100: %v\n%s", err, out)
	}
}

// shuffleChild crowds this process's descriptors, runs one sandbox and
// prints its result (or the error) as the test's output.
func shuffleChild() {
	fail := func(err error) {
		fmt.Println("child:", err)
		os.Exit(1)
	}
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		fail(err)
	}
	// Hold every free descriptor up to 98.
	var held []int
	for {
		fd, err := unix.FcntlInt(uintptr(null), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			fail(err)
		}
		if fd > 98 {
			unix.Close(fd)
			break
		}
		held = append(held, fd)
	}
	l, err := launcher.New(launcher.Options{})
	if err != nil {
		fail(err)
	}
	// The tool's pass-list: the highest held descriptor (98), then one low
	// descriptor twenty times over. Each copy sits at a position above
	// its number, so the fork moves each one up from 99 on before it
	// lands: twenty numbers above every descriptor passed get written.
	pass := []*os.File{os.NewFile(uintptr(held[len(held)-1]), "high")}
	for _, fd := range held[:len(held)-1] {
		if fd < 60 {
			unix.Close(fd)
		}
	}
	low, err := os.Open("/dev/null")
	if err != nil {
		fail(err)
	}
	if low.Fd() > 20 {
		fail(fmt.Errorf("no low descriptor free: /dev/null opened at %d", low.Fd()))
	}
	for range 20 {
		pass = append(pass, low)
	}
	res, err := l.Run(context.Background(), launcher.Request{Profile: "standard", Argv: []string{"/bin/true"}, ExtraFiles: pass})
	if err != nil {
		fail(err)
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	if res.SetupError != nil || res.ExitCode != 0 {
		os.Exit(1)
	}
}
