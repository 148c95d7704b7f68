package nsinit

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestJoinProgram: a plan that joins namespaces (str bwrap's --userns,
// --pidns) changes no id in L4's child half (it is still in the
// launcher's user namespace), then, at sub-step 0a and before step 1 moves any descriptor:
// setns into the user namespace first (what it unshares next is owned by
// it), the pid namespace, the fork, root's ids (root mode) before any
// mount, the parent-death signal and only then the check that the parent
// lives; step 17 checks the parent again after the launcher.
func TestJoinProgram(t *testing.T) {
	c := directConfig()
	c.Join = &Join{UserNS: 11, PidNS: 12, Unshare: unix.CLONE_NEWNS | unix.CLONE_NEWIPC}
	p, err := CompileDirect(c, directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	var join, l4 []string
	checks := 0
	for i, d := range p.descs {
		o := p.ops[i]
		switch {
		case d.step == StepLClone && strings.Contains(d.action, "set"):
			l4 = append(l4, d.action)
		case d.step == StepJoinNS:
			join = append(join, strings.TrimPrefix(d.action, "clone child: ")+" "+d.path)
			if d.action == "setns" && o.a[0] != 11 && o.a[0] != 12 {
				t.Errorf("setns of fd %d", o.a[0])
			}
		case d.step == StepParentDeath && o.kind == opCheckPoll:
			checks++
		}
	}
	want := "prctl PR_SET_DUMPABLE,setns fd 11,unshare ,setns fd 12,getpid ,pidfd_open the clone child,fork ,setgroups (direct: the launcher's own child)," +
		"setresgid (direct: the launcher's own child),setresuid (direct: the launcher's own child),prctl PR_SET_PDEATHSIG,check the clone child its pidfd"
	if len(l4) != 1 || l4[0] != "clone child: setsid" || strings.Join(join, ",") != want || checks != 2 {
		t.Errorf("L4 %q; 0a %q, want %q; step 17 polls %d descriptors, want 2", l4, join, want, checks)
	}
	if last := p.descs[findOp(t, p, StepJoinNS, "fork")+1]; last.step != StepJoinNS {
		t.Errorf("after the fork: step %v", last.step)
	}
}
