package seccomp

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// A per-tool template (launcher/template) is one Python process that
// imported the tool once and forks every call into namespaces of its own.
// Its filter is the profile's policy plus what the fork needs; each call's
// child stacks a second filter that closes those openings again. Both are
// derived here from the profile's policy, in code, rule by rule with a
// reason, and each derived policy is checked against the properties it
// exists for (checkTemplate, checkCall) before it is returned.

// CallCloneFlags are the namespaces a template's clone creates for each
// call: user, mount, pid, network, ipc, uts and cgroup. The template's
// filter sends exactly CallCloneFlags|SIGCHLD to the supervisor, which
// lets through only the one clone it ordered.
const CallCloneFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP

// CallClone is the whole flags register of a template's clone: the call's
// namespaces and SIGCHLD (the exit signal the template reaps by). No
// CLONE_VM, CLONE_FILES, CLONE_PIDFD, CLONE_SETTLS...: the child is a
// plain copy of the template.
const CallClone = uint64(CallCloneFlags | int(unix.SIGCHLD))

// prCapbsetDrop and prSetDumpable are prctl's PR_CAPBSET_DROP and
// PR_SET_DUMPABLE.
const (
	prCapbsetDrop = 0x18
	prSetDumpable = 0x4
)

// afNetlink, sockRaw and the socket-ioctl range, as the rules below
// compare them.
const (
	afNetlink     = 0x10
	sockTypeMask  = 0xf
	sockRaw       = 0x3
	sockPacket    = 0xa
	sockIoctlMask = 0xff00
	sockIoctl     = 0x8900 // SIOC*: 0x8900-0x89ff
)

func u64(v uint64) *uint64 { return &v }

// templateRules are prepended to the profile's rules (conditional rules
// are tried in file order, so these decide first).
var templateRules = []Rule{
	{
		Names:  []string{"clone"},
		Action: Action{Kind: ActionNotify},
		Args:   []Arg{{Index: 0, Op: OpEq, Value: u64(CallClone)}},
		Reason: "the one fork per call into fresh user, mount, pid, network, ipc, uts and cgroup namespaces: the supervisor lets it through only when it ordered it, from the template's pid, once (SECCOMP_USER_NOTIF_FLAG_CONTINUE; the flags are a register, so there is nothing to race); every other caller and every other moment gets EPERM, and every other namespace flag stays EPERM by the profile's clone rule",
	},
	{
		Names:  []string{"socket"},
		Action: Action{Kind: ActionErrno, Errno: "EPERM"},
		Args:   []Arg{{Index: 0, Op: OpMaskedEq, Mask: u64(0xffffffff), Value: u64(afNetlink)}},
		Reason: "no netlink at all: a call's child holds CAP_NET_ADMIN in its own network namespace until it drops it, and rtnetlink is the usual door to network configuration code (the supervisor brings lo up from the host)",
	},
	{
		Names:  []string{"socket"},
		Action: Action{Kind: ActionErrno, Errno: "EPERM"},
		Args:   []Arg{{Index: 1, Op: OpMaskedEq, Mask: u64(sockTypeMask), Value: u64(sockRaw)}},
		Reason: "no raw sockets: a call's child holds CAP_NET_RAW in its own network namespace until it drops it",
	},
	{
		Names:  []string{"socket"},
		Action: Action{Kind: ActionErrno, Errno: "EPERM"},
		Args:   []Arg{{Index: 1, Op: OpMaskedEq, Mask: u64(sockTypeMask), Value: u64(sockPacket)}},
		Reason: "no SOCK_PACKET sockets: like raw sockets, they need CAP_NET_RAW, which a call's child holds in its own network namespace until it drops it",
	},
	{
		Names:  []string{"ioctl"},
		Action: Action{Kind: ActionErrno, Errno: "EPERM"},
		Args:   []Arg{{Index: 1, Op: OpMaskedEq, Mask: u64(0xffffffff & sockIoctlMask), Value: u64(sockIoctl)}},
		Reason: "socket ioctls (SIOC*, 0x8900-0x89ff: interfaces, routes, ARP): a call's child holds CAP_NET_ADMIN in its own network namespace until it drops it; cmd is an unsigned int, so the mask has no upper bits",
	},
	{
		Names:  []string{"prctl"},
		Action: Action{Kind: ActionAllow},
		Args:   []Arg{{Index: 0, Op: OpMaskedEq, Mask: u64(0xffffffff), Value: u64(prCapbsetDrop)}},
		Reason: "prctl(PR_CAPBSET_DROP): a call's child gets a full bounding set with its new user namespace and empties it before any call data; it can only remove capabilities",
	},
	{
		Names:  []string{"prctl"},
		Action: Action{Kind: ActionAllow},
		Args:   []Arg{{Index: 0, Op: OpMaskedEq, Mask: u64(0xffffffff), Value: u64(prSetDumpable)}, {Index: 1, Op: OpEq, Value: u64(1)}},
		Reason: "prctl(PR_SET_DUMPABLE, 1): a call's child's uid change made it non-dumpable, and no execve follows to make it dumpable again as a cold sandbox's tool is (its /proc/self would be root's: the tool could not list its own /proc/self/fd or ns); ptrace and process_vm_* stay refused, and the template, which owns the call's user namespace, could reach it either way",
	},
}

// templateCapset replaces the profile's rule for capset.
var templateCapset = Rule{
	Names:  []string{"capset"},
	Action: Action{Kind: ActionAllow},
	Reason: "a call's child empties its capability sets before any call data: its uid in its new user namespace was never 0 (the template's is not mapped there), so the uid change clears nothing by itself; capset can only lower what the caller holds",
}

// TemplatePolicy is the filter of a per-tool template: base (the
// profile's policy) with templateRules first, and capset allowed. The
// mount API stays as the profile has it (refused): the supervisor
// attaches each call's mounts from the host.
func TemplatePolicy(base *Policy) (*Policy, error) {
	p := derive(base, base.Name+"-template", "template of "+base.Name+": the profile's policy plus the one notified clone per call")
	p.Rules = append(slices.Clone(templateRules), withoutSyscall(base.Rules, "capset")...)
	p.Rules = append(p.Rules, templateCapset)
	p.Rules = dropDeadPrctl(p.Rules, base)
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("seccomp: derive template policy of %s: %w", base.Name, err)
	}
	if err := checkTemplate(p); err != nil {
		return nil, fmt.Errorf("seccomp: derive template policy of %s: %w", base.Name, err)
	}
	return p, nil
}

// CallPolicy is the filter a call's child stacks on the template's
// before any call data: the profile's policy with netlink, raw sockets
// and socket ioctls refused. Stacked, the kernel takes the stricter answer of the two filters,
// so the notified clone is EPERM here and the template's openings are
// closed again.
func CallPolicy(base *Policy) (*Policy, error) {
	p := derive(base, base.Name+"-call", "a template call of "+base.Name+": the profile's policy, stacked on the template's, closing what the fork needed")
	var own []Rule
	for _, r := range templateRules {
		if r.Kind == ActionErrno {
			own = append(own, r)
		}
	}
	p.Rules = append(own, base.Rules...)
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("seccomp: derive call policy of %s: %w", base.Name, err)
	}
	if err := checkCall(p); err != nil {
		return nil, fmt.Errorf("seccomp: derive call policy of %s: %w", base.Name, err)
	}
	return p, nil
}

func derive(base *Policy, name, desc string) *Policy {
	return &Policy{Version: base.Version, Name: name, Description: desc, DefaultAction: base.DefaultAction, source: "derived:" + name}
}

// withoutSyscall is rules with name removed from each rule's names (a
// rule left without names is dropped).
func withoutSyscall(rules []Rule, name string) []Rule {
	var out []Rule
	for _, r := range rules {
		if i := slices.Index(r.Names, name); i >= 0 {
			r.Names = slices.Delete(slices.Clone(r.Names), i, i+1)
			if len(r.Names) == 0 {
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// dropDeadPrctl removes the template's prctl rules (PR_CAPBSET_DROP,
// PR_SET_DUMPABLE) when base already allows every prctl (they would be
// dead, which Validate refuses).
func dropDeadPrctl(rules []Rule, base *Policy) []Rule {
	for _, r := range base.Rules {
		if len(r.Args) == 0 && slices.Contains(r.Names, "prctl") && r.Kind == ActionAllow {
			return slices.DeleteFunc(rules, func(r Rule) bool {
				return len(r.Names) == 1 && r.Names[0] == "prctl" && len(r.Args) > 0 && r.Kind == ActionAllow &&
					(*r.Args[0].Value == prCapbsetDrop || *r.Args[0].Value == prSetDumpable)
			})
		}
	}
	return rules
}

// nsFlags are every namespace flag clone knows, one at a time
// (CLONE_NEWTIME, 0x80, is only for unshare and clone3: in clone's flags
// register the low byte is the exit signal).
var nsFlags = []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
	unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET}

// checkTemplate is the template filter's checklist, on the native arch:
// the call clone is notified and nothing else that creates or joins a
// namespace is ever allowed or notified; netlink is refused.
func checkTemplate(p *Policy) error {
	eval, err := evaluator(p)
	if err != nil {
		return err
	}
	var errs []error
	want := func(what string, got uint32, ok func(uint32) bool) {
		if !ok(got) {
			errs = append(errs, fmt.Errorf("%s: %s", what, DescribeRet(got)))
		}
	}
	refused := func(r uint32) bool {
		return r&RetActionFull != RetAllow && r&RetActionFull != RetUserNotif && r&RetActionFull != RetLog
	}
	want("clone(CallClone) must be notified", eval("clone", CallClone), func(r uint32) bool { return r == RetUserNotif })
	want("clone(CallClone|CLONE_PIDFD) must be refused", eval("clone", CallClone|unix.CLONE_PIDFD), refused)
	want("clone(CallClone without SIGCHLD) must be refused", eval("clone", uint64(CallCloneFlags)), refused)
	for _, f := range nsFlags {
		want(fmt.Sprintf("clone(%#x|SIGCHLD) must be refused", f), eval("clone", f|uint64(unix.SIGCHLD)), refused)
		want(fmt.Sprintf("unshare(%#x) must be refused", f), eval("unshare", f), refused)
	}
	want("unshare(CLONE_NEWTIME) must be refused", eval("unshare", unix.CLONE_NEWTIME), refused)
	for _, s := range []string{"setns", "mount", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "pivot_root", "umount2", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"} {
		want(s+" must be refused", eval(s, 0), refused)
	}
	want("socket(AF_NETLINK) must be refused", eval("socket", afNetlink), refused)
	return errors.Join(errs...)
}

// checkCall is the call filter's checklist: nothing that creates or
// joins a namespace or mounts is allowed or notified.
func checkCall(p *Policy) error {
	eval, err := evaluator(p)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range []struct {
		sys  string
		arg0 uint64
	}{{"clone", CallClone}, {"move_mount", 0}, {"mount", 0}, {"setns", 0}, {"unshare", uint64(CallCloneFlags)}, {"socket", afNetlink}, {"fsopen", 0}, {"open_tree", 0}} {
		if r := eval(c.sys, c.arg0); r&RetActionFull == RetAllow || r&RetActionFull == RetUserNotif || r&RetActionFull == RetLog {
			errs = append(errs, fmt.Errorf("%s(%#x) must be refused: %s", c.sys, c.arg0, DescribeRet(r)))
		}
	}
	return errors.Join(errs...)
}

// evaluator evaluates p for a syscall by name with arg0 on the native
// arch (a syscall absent there counts as refused: ENOSYS).
func evaluator(p *Policy) (func(string, uint64) uint32, error) {
	arch, err := native()
	if err != nil {
		return nil, err
	}
	return func(name string, arg0 uint64) uint32 {
		nr, ok := arch.resolve(name)
		if !ok {
			return RetErrno | uint32(unix.ENOSYS)
		}
		return p.evaluate(Data{Nr: nr, Arch: arch.audit, Args: [6]uint64{arg0}}, arch)
	}, nil
}
