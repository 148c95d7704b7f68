package hostbox

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Python is the one place where str runs a program of its own on the host
// outside a sandbox (SECURITY.md, "Package installation"): the host's own
// Python interpreter, as the caller (the worker: root in production), on a script
// that is str's own text, never a tool's or a package's. Two callers use
// it: the installer asks the interpreter for its site-packages dirs
// (worker/manifest), and the runner's bytecode cache is compiled from
// str's embedded runner source (worker/runner).
//
// Checklist, each against a way tool or package code could run here:
//  1. -I: isolated mode, so no PYTHON* variable, no user site dir and no
//     script directory on sys.path;
//  2. -S: no site module at start, so no site-packages on the path and no
//     .pth line or sitecustomize/usercustomize module is ever processed
//     (a package's sitecustomize.py ran on the host as root when
//     installation used only -s; issue 18 §1);
//  3. a fixed environment (PATH, LANG), never the caller's;
//  4. the script is passed with -c from a constant of the caller's
//     package, and args are paths the caller made;
//  5. bounded by ctx (the callers set a timeout); stderr kept, its last
//     2 KiB in the error.
func Python(ctx context.Context, python, script string, args ...string) ([]byte, error) {
	argv := append([]string{"-I", "-S", "-c", script}, args...)
	cmd := exec.CommandContext(ctx, python, argv...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2048 {
			msg = "..." + msg[len(msg)-2048:]
		}
		return nil, fmt.Errorf("%s -I -S: %w: %s", python, err, msg)
	}
	return stdout.Bytes(), nil
}
