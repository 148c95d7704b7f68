package policyyaml

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

// The tests of decoding policy files, moved here from package seccomp
// with the decoder: every message of a bad policy is the one it was.

func nativeAudit() uint32 {
	if runtime.GOARCH == "arm64" {
		return seccomp.AuditArchAArch64
	}
	return seccomp.AuditArchX86_64
}

const goodPolicy = `version: 1
name: tiny
description: "a small valid policy"
default_action: {action: errno, errno: ENOSYS}
rules:
  - names: [read, write]
    action: allow
    reason: "basic I/O"
  - names: [mount]
    action: errno
    errno: EPERM
    reason: "no mounts"
`

func TestDecodeValid(t *testing.T) {
	p, err := Decode([]byte(goodPolicy), "test:tiny")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rules) != 2 || p.Rules[1].Action.String() != "errno EPERM" || p.DefaultAction.String() != "errno ENOSYS" {
		t.Fatalf("decoded %+v", p)
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(file, []byte(goodPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if p.Source() != file {
		t.Errorf("source %q, want %q", p.Source(), file)
	}
	_, err = LoadFile(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("LoadFile(missing) = %v, want ErrNotExist naming the path", err)
	}
}

// validationErrors flattens the errors.Join result of Validate.
func validationErrors(t *testing.T, err error) []*seccomp.ValidationError {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error %q is not an errors.Join list", err)
	}
	var out []*seccomp.ValidationError
	for _, e := range joined.Unwrap() {
		var ve *seccomp.ValidationError
		if !errors.As(e, &ve) {
			t.Fatalf("error %q is not a *seccomp.ValidationError", e)
		}
		out = append(out, ve)
	}
	return out
}

func TestValidateCollectsEveryProblem(t *testing.T) {
	// Three independent problems in three rules: all must be reported.
	src := `version: 1
name: bad
description: "three problems"
default_action: {action: errno, errno: ENOSYS}
rules:
  - names: [read, not_a_syscall]
    action: allow
    reason: "x"
  - names: [write]
    action: allow
  - names: [mount]
    action: errno
    errno: EWHATEVER
    reason: "x"
`
	_, err := Decode([]byte(src), "test:bad")
	errs := validationErrors(t, err)
	if len(errs) != 3 {
		t.Fatalf("got %d problems, want 3:\n%v", len(errs), err)
	}
	want := []struct {
		rule  int
		field string
		msg   string
	}{
		{0, "names[1]", `unknown syscall "not_a_syscall"`},
		{1, "reason", "missing"},
		{2, "errno", `unknown errno "EWHATEVER"`},
	}
	for i, w := range want {
		e := errs[i]
		if e.Policy != "test:bad" || e.Rule != w.rule || e.Field != w.field || !strings.Contains(e.Msg, w.msg) {
			t.Errorf("problem %d = %+v, want rule %d field %s msg ~%q", i, e, w.rule, w.field, w.msg)
		}
		if !strings.HasPrefix(e.Error(), "seccomp: policy test:bad: rules[") {
			t.Errorf("problem %d message %q does not name policy and rule", i, e.Error())
		}
	}
}

func TestDecodeRejectsUnknownField(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"top level", strings.Replace(goodPolicy, "description:", "comment: x\ndescription:", 1), "field comment not found"},
		{"in a rule", strings.Replace(goodPolicy, `reason: "basic I/O"`, `reasons: "basic I/O"`, 1), "field reasons not found"},
		{"in an arg", strings.Replace(goodPolicy, `reason: "no mounts"`, "reason: x\n    args: [{index: 0, op: eq, value: 1, flags: 2}]", 1), "field flags not found"},
	} {
		_, err := Decode([]byte(tc.src), "test:unknown")
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "test:unknown") {
			t.Errorf("%s: err = %v, want it to contain %q and the source", tc.name, err, tc.want)
		}
	}
}

func TestDecodeRejectsSecondDocument(t *testing.T) {
	_, err := Decode([]byte(goodPolicy+"---\nversion: 1\n"), "test:two")
	if err == nil || !strings.Contains(err.Error(), "more than one YAML document") {
		t.Fatalf("err = %v", err)
	}
	_, err = Decode(nil, "test:empty")
	if err == nil || !strings.Contains(err.Error(), "empty document") {
		t.Fatalf("err = %v", err)
	}
}

func TestValidateChecks(t *testing.T) {
	rule := func(body string) string {
		return strings.Replace(goodPolicy, "  - names: [mount]", body+"\n  - names: [mount]", 1)
	}
	for _, tc := range []struct {
		name, src, field, msg string
	}{
		{"version", strings.Replace(goodPolicy, "version: 1", "version: 2", 1), "version", "is 2, want 1"},
		{"name", strings.Replace(goodPolicy, "name: tiny", "name: Tiny Policy", 1), "name", "not a lower-case identifier"},
		{"description", strings.Replace(goodPolicy, `description: "a small valid policy"`, `description: ""`, 1), "description", "empty"},
		{"default allow", strings.Replace(goodPolicy, "{action: errno, errno: ENOSYS}", "{action: allow}", 1), "default_action.action", "default-deny"},
		{"default errno missing", strings.Replace(goodPolicy, "{action: errno, errno: ENOSYS}", "{action: errno}", 1), "default_action.errno", "required"},
		{"unknown action", rule("  - names: [close]\n    action: permit\n    reason: x"), "action", `unknown action "permit"`},
		{"errno on allow", rule("  - names: [close]\n    action: allow\n    errno: EPERM\n    reason: x"), "errno", "only allowed with action errno"},
		{"empty names", rule("  - names: []\n    action: allow\n    reason: x"), "names", "empty"},
		{"name twice", rule("  - names: [close, close]\n    action: allow\n    reason: x"), "names[1]", "listed twice"},
		{"duplicate unconditional", rule("  - names: [read]\n    action: errno\n    errno: EPERM\n    reason: x"), "names", `"read" already has an unconditional rule`},
		{"index", rule("  - names: [close]\n    action: allow\n    args: [{index: 6, op: eq, value: 1}]\n    reason: x"), "args[0].index", "out of range"},
		{"same index twice", rule("  - names: [close]\n    action: allow\n    args: [{index: 0, op: eq, value: 1}, {index: 0, op: eq, value: 2}]\n    reason: x"), "args[1].index", "already has a condition"},
		{"unknown op", rule("  - names: [close]\n    action: allow\n    args: [{index: 0, op: equals, value: 1}]\n    reason: x"), "args[0].op", `unknown op "equals"`},
		{"missing value", rule("  - names: [close]\n    action: allow\n    args: [{index: 0, op: eq}]\n    reason: x"), "args[0].value", "missing"},
		{"masked_eq without mask", rule("  - names: [close]\n    action: allow\n    args: [{index: 0, op: masked_eq, value: 1}]\n    reason: x"), "args[0].mask", "required"},
		{"mask with eq", rule("  - names: [close]\n    action: allow\n    args: [{index: 0, op: eq, mask: 1, value: 1}]\n    reason: x"), "args[0].mask", "only allowed with op masked_eq"},
		{"value outside mask", rule("  - names: [close]\n    action: allow\n    args: [{index: 0, op: masked_eq, mask: 0xff, value: 0x100}]\n    reason: x"), "args[0].value", "can never match"},
		{"dead conditional", rule("  - names: [read]\n    action: allow\n    args: [{index: 0, op: eq, value: 1}]\n    reason: x"), "args", "this conditional rule is dead"},
		{"same conditions twice", rule("  - names: [close]\n    action: allow\n    args: [{index: 0, op: eq, value: 1}]\n    reason: x\n  - names: [close]\n    action: errno\n    errno: EPERM\n    args: [{index: 0, op: eq, value: 1}]\n    reason: x"), "args", "same conditions"},
		{"default action mixed", rule("  - names: [close]\n    action: errno\n    errno: ENOSYS\n    reason: x\n  - names: [close]\n    action: allow\n    args: [{index: 0, op: eq, value: 1}]\n    reason: x"), "action", "only documents a decision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.src), "test:"+tc.name)
			errs := validationErrors(t, err)
			found := false
			for _, e := range errs {
				if e.Field == tc.field && strings.Contains(e.Msg, tc.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("want a problem on %s containing %q, got:\n%v", tc.field, tc.msg, err)
			}
		})
	}
}

// An operator's policy file may extend an embedded policy: it gets the
// base's rules and default action, minus the replaced syscalls, then its
// own rules.
func TestExtendsResolvesOnce(t *testing.T) {
	const child = `version: 1
name: mine
description: "standard, with mknod refused"
extends: standard
replaces: [mknod, mknodat]
rules:
  - names: [mknod, mknodat]
    action: errno
    errno: EPERM
    reason: "no fifos here"
`
	p, err := Decode([]byte(child), "test:mine")
	if err != nil {
		t.Fatal(err)
	}
	base, err := seccomp.Load("standard")
	if err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != base.DefaultAction {
		t.Errorf("default action %s, want the base's %s", p.DefaultAction, base.DefaultAction)
	}
	last := p.Rules[len(p.Rules)-1]
	if !reflect.DeepEqual(last.Names, []string{"mknod", "mknodat"}) || last.Action.String() != "errno EPERM" {
		t.Errorf("own rule not last: %+v", last)
	}
	mentions := 0
	for _, r := range p.Rules {
		for _, n := range r.Names {
			if n == "mknod" {
				mentions++
			}
		}
	}
	if mentions != 1 || len(p.Rules) != len(base.Rules) {
		t.Errorf("mknod in %d rules (want 1), %d rules (want the base's %d: one dropped, one added)", mentions, len(p.Rules), len(base.Rules))
	}
	// The resolved policy compiles like any other, and decides mknod by
	// its own rule.
	prog, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := seccomp.Simulate(prog.Filter, seccomp.Data{Nr: unix.SYS_MKNODAT, Arch: nativeAudit()}); got != seccomp.RetErrno|1 {
		t.Errorf("mknodat under the child = %s, want errno EPERM", seccomp.DescribeRet(got))
	}
}

func TestExtendsChecks(t *testing.T) {
	head := "version: 1\nname: child\ndescription: \"d\"\n"
	for _, c := range []struct{ name, doc, field, msg string }{
		{"replaces without extends", head + "default_action: {action: errno, errno: ENOSYS}\nreplaces: [read]\nrules:\n  - {names: [read], action: allow, reason: r}\n",
			"replaces", "needs extends"},
		{"unknown base", head + "extends: nosuch\nrules:\n  - {names: [read], action: allow, reason: r}\n",
			"extends", `base policy "nosuch"`},
		{"replaced but not in the base", head + "extends: restrictive\nreplaces: [sync]\nrules:\n  - {names: [sync], action: allow, reason: r}\n",
			"replaces[0]", "has no rule in base policy restrictive"},
		{"silent removal", head + "extends: restrictive\nreplaces: [ptrace]\nrules:\n  - {names: [sync], action: allow, reason: r}\n",
			"replaces[0]", "replaced by no rule of this policy"},
		{"listed twice", head + "extends: restrictive\nreplaces: [ptrace, ptrace]\nrules:\n  - {names: [ptrace], action: allow, reason: r}\n",
			"replaces[1]", "listed twice"},
		// Without replaces, deciding a syscall the base decides
		// unconditionally is the same conflict as in one file.
		{"override without replaces", head + "extends: restrictive\nrules:\n  - {names: [ptrace], action: allow, reason: r}\n",
			"names", `"ptrace" already has an unconditional rule`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode([]byte(c.doc), "test:child")
			var hit bool
			for _, ve := range validationErrors(t, err) {
				if ve.Field == c.field && strings.Contains(ve.Msg, c.msg) && ve.Policy == "test:child" {
					hit = true
				}
			}
			if !hit {
				t.Fatalf("error %q, want field %s with %q", err, c.field, c.msg)
			}
		})
	}
}

// A chain of extends that comes back to a policy being loaded is refused
// (the embedded files cannot form one; the loader is asked directly).
func TestExtendsCycle(t *testing.T) {
	doc := "version: 1\nname: standard\ndescription: \"d\"\nextends: restrictive\nrules:\n  - {names: [sync], action: allow, reason: r}\n"
	_, err := decode([]byte(doc), "test:cycle", []string{"restrictive", "standard"})
	if err == nil || !strings.Contains(err.Error(), `"restrictive" extends itself (chain restrictive -> standard -> restrictive)`) {
		t.Fatalf("cycle: %v", err)
	}
}
