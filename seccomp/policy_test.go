package seccomp

import (
	"reflect"
	"strings"
	"testing"
)

func TestNamesListsEmbeddedPolicies(t *testing.T) {
	want := []string{"nesting", "permissive", "restrictive", "standard"}
	if got := Names(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, n := range want {
		p, err := Load(n)
		if err != nil {
			t.Fatalf("Load(%q): %v", n, err)
		}
		if p.Name != n || p.Version != 1 || p.Source() != "embedded:"+n+".yaml" {
			t.Errorf("Load(%q) = name %q version %d source %q", n, p.Name, p.Version, p.Source())
		}
	}
}

func TestLoadUnknownPolicy(t *testing.T) {
	for _, n := range []string{"nosuch", "../standard", "Standard", ""} {
		_, err := Load(n)
		if err == nil || !strings.Contains(err.Error(), "known: nesting, permissive, restrictive, standard") {
			t.Errorf("Load(%q) = %v, want an error listing the known policies", n, err)
		}
	}
}

func TestValidateWithoutSourceNamesPolicy(t *testing.T) {
	p := &Policy{Version: 1, Name: "inline", Description: "d", DefaultAction: Action{Kind: ActionErrno, Errno: "ENOSYS"},
		Rules: []Rule{{Names: []string{"read"}, Action: Action{Kind: ActionAllow}}}}
	err := p.Validate()
	if err == nil || !strings.Contains(err.Error(), "seccomp: policy inline: rules[0].reason: missing") {
		t.Fatalf("err = %v", err)
	}
	if _, err := p.Compile(); err == nil {
		t.Fatal("Compile accepted an invalid policy")
	}
}

// nestingOpens are the syscalls the nesting policy lets a sandbox inside
// the sandbox use that every other embedded policy refuses with EPERM.
var nestingOpens = map[string]bool{"mount": true, "umount2": true, "pivot_root": true, "chroot": true,
	"open_tree": true, "move_mount": true, "mount_setattr": true, "clone": true, "unshare": true, "setns": true,
	"sethostname": true, "setdomainname": true}

// Every embedded policy must give each rule a reason of some substance,
// and the known-dangerous set must be identical in all of them (nesting's
// less exactly nestingOpens).
func TestEmbeddedPoliciesShareTheDangerousSet(t *testing.T) {
	deny := func(p *Policy) map[string]string {
		m := map[string]string{}
		for _, r := range p.Rules {
			if len(strings.Fields(r.Reason)) < 3 {
				t.Errorf("policy %s: rule %v has a too-short reason %q", p.Name, r.Names, r.Reason)
			}
			if len(r.Args) == 0 && r.Action.String() == "errno EPERM" {
				for _, n := range r.Names {
					m[n] = r.Reason
				}
			}
		}
		return m
	}
	var first map[string]string
	var firstName string
	for _, n := range Names() {
		p, err := Load(n)
		if err != nil {
			t.Fatal(err)
		}
		d := deny(p)
		if n == "nesting" {
			for s := range nestingOpens {
				if _, ok := d[s]; ok {
					t.Errorf("nesting still denies %s", s)
				}
				d[s] = "opened by nesting"
			}
		}
		if first == nil {
			first, firstName = d, n
			continue
		}
		for s := range first {
			if _, ok := d[s]; !ok && s != "prlimit64" {
				t.Errorf("%s denies %s with EPERM but %s does not", firstName, s, n)
			}
		}
		for s := range d {
			if _, ok := first[s]; !ok && s != "prlimit64" {
				t.Errorf("%s denies %s with EPERM but %s does not", n, s, firstName)
			}
		}
	}
}
