package nsinit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// The code a CLONE_VM child may run: this package's functions (the walk
// below finds which: the ones reachable from the clone) and the raw system
// call entry, syscall.RawSyscall and RawSyscall6 down to the runtime's
// SYSCALL instruction. Nothing else: no allocation, write barrier, stack
// check (runtime.morestack), bounds-check panic or race-detector hook
// runs on the launcher's memory while its runtime runs.
const (
	pkgPrefix  = "github.com/securetoolruntime/str/nsinit."
	cloneEntry = pkgPrefix + "rawClone.abi0" // the assembly: its child calls childEntry
)

var rawSyscallEntry = []string{"syscall.RawSyscall", "syscall.RawSyscall6", "internal/runtime/syscall/linux.Syscall6"}

// TestCloneChildCallsNothingElse disassembles this package's test binary,
// built as this one was (-race or not), from the clone's entry: every
// call the child can reach is the raw system call entry or a function of
// this package whose own calls pass the same check.
func TestCloneChildCallsNothingElse(t *testing.T) {
	if !CloneSharesMemory {
		t.Skip("the clone child is a fork here (CloneSharesMemory false): it runs on its own copy of the memory")
	}
	if runtime.GOARCH != "amd64" {
		t.Fatalf("the check reads amd64 disassembly: teach it %s's before its clone shares memory", runtime.GOARCH)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		mustwork.Skip(t, fmt.Sprintf("go not on PATH (%v): cannot disassemble", err))
	}
	syms := "^(" + regexp.QuoteMeta(pkgPrefix)
	for _, s := range rawSyscallEntry {
		syms += "|" + regexp.QuoteMeta(s) + "$"
	}
	out, err := exec.Command(gobin, "tool", "objdump", "-s", syms+")", buildLikeThis(t, gobin)).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool objdump: %v\n%s", err, out)
	}
	code := parseObjdump(string(out))

	// rawClone's child calls childEntry through a register: check that
	// the pointer clone passes is childEntry's code.
	entry := **(**uintptr)(unsafe.Pointer(&childEntryFn))
	if f := runtime.FuncForPC(entry); f == nil || f.Name() != pkgPrefix+"childEntry" {
		t.Fatalf("rawClone's child enters %#x (%v), want %schildEntry", entry, f, pkgPrefix)
	}
	reached := map[string]bool{cloneEntry: true}
	todo := []string{cloneEntry}
	for len(todo) > 0 {
		fn := todo[0]
		todo = todo[1:]
		for _, c := range code[fn] {
			target := c.target
			switch {
			case target == "" && fn == cloneEntry:
				target = pkgPrefix + "childEntry" // checked above
			case target == "":
				t.Errorf("%s (%s): %s: an indirect call in the child's code", fn, c.at, c.text)
				continue
			}
			if _, ok := code[target]; !ok {
				t.Errorf("%s (%s): %s: the child calls a function neither this package's nor the raw system call entry", fn, c.at, c.text)
				continue
			}
			if !reached[target] {
				reached[target] = true
				todo = append(todo, target)
			}
		}
	}
	for _, fn := range []string{pkgPrefix + "(*Program).child", pkgPrefix + "awaitCallRaw", rawSyscallEntry[2]} {
		if !reached[fn] {
			t.Errorf("the walk from %s did not reach %s: the disassembly was not read right", cloneEntry, fn)
		}
	}
	if t.Failed() {
		t.Logf("reached from the clone: %s", strings.Join(slices.Sorted(func(yield func(string) bool) {
			for fn := range reached {
				if !yield(fn) {
					return
				}
			}
		}), ", "))
	}
}

// buildLikeThis builds this package's test binary with the settings
// that shape the code of the running one (go test strips its binary of
// the symbols objdump needs) and returns its path.
func buildLikeThis(t *testing.T, gobin string) string {
	t.Helper()
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build information in the test binary")
	}
	bin := filepath.Join(t.TempDir(), "nsinit.test")
	args := []string{"test", "-c", "-o", bin}
	env := os.Environ()
	for _, s := range info.Settings {
		switch s.Key {
		case "-race", "-msan", "-asan":
			if s.Value == "true" {
				args = append(args, s.Key)
			}
		case "-tags", "-gcflags":
			args = append(args, s.Key+"="+s.Value)
		case "CGO_ENABLED", "GOAMD64":
			env = append(env, s.Key+"="+s.Value)
		}
	}
	cmd := exec.Command(gobin, append(args, ".")...)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// objCall is one CALL (or a JMP to another function) in a disassembly:
// its target function ("" for an indirect one), the instruction and its
// source line.
type objCall struct{ target, text, at string }

// parseObjdump is `go tool objdump`'s output as each function's calls.
func parseObjdump(out string) map[string][]objCall {
	code := map[string][]objCall{}
	var fn string
	direct := regexp.MustCompile(`^(CALL|JMP) ([^ ]+)\(SB\)$`)
	for _, line := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(line, "TEXT "); ok {
			fn, _, _ = strings.Cut(name, "(SB)")
			code[fn] = nil
			continue
		}
		fields := strings.Split(strings.TrimSpace(line), "\t")
		text := strings.TrimSpace(fields[len(fields)-1])
		if fn == "" || !strings.HasPrefix(text, "CALL") && !strings.HasPrefix(text, "JMP") {
			continue
		}
		switch m := direct.FindStringSubmatch(text); {
		case m != nil:
			code[fn] = append(code[fn], objCall{target: m[2], text: text, at: fields[0]})
		case strings.HasPrefix(text, "CALL"):
			code[fn] = append(code[fn], objCall{text: text, at: fields[0]})
		}
		// A JMP to an address is a branch within the function.
	}
	return code
}
