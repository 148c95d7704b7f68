package bwrap

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ArgKind says how one argument of an option is checked at parse time.
type ArgKind int

const (
	ArgString ArgKind = iota // any string (a path, a name, a value)
	ArgFD                    // a descriptor number: decimal, >= 0
	ArgOctal                 // a mode: octal, <= 07777
	ArgID                    // a uid or gid: decimal, >= 0
	ArgSize                  // a byte count: non-zero, C strtoull base 0 (0x.., 0..)
	ArgCap                   // a capability name (CAP_SYS_ADMIN, sys_admin) or ALL
)

// Option is one entry of bubblewrap's documented option list.
type Option struct {
	Name string
	Args []ArgKind
	// Modifier options (--perms, --size) apply to the next option, which
	// must be one that takes them.
	modifier              bool
	takesPerms, takesSize bool
}

// MaxTmpfsBytes is the largest --size bubblewrap accepts (SIZE_MAX >> 1
// on 64-bit); larger is an error there too.
const MaxTmpfsBytes = uint64(1)<<63 - 1

// MaxArgs bounds the argument count, --args expansions included (the
// same limit bubblewrap keeps, against a runaway --args file).
const MaxArgs = 9000

var (
	s2  = []ArgKind{ArgString, ArgString}
	s1  = []ArgKind{ArgString}
	f1  = []ArgKind{ArgFD}
	fdS = []ArgKind{ArgFD, ArgString}
)

// options is bubblewrap's option list (its 0.11 manual), each with its
// arguments. --help, --version, --args and -- are handled by Parse itself.
var options = []Option{
	{Name: "--argv0", Args: s1},
	{Name: "--level-prefix"},
	{Name: "--unshare-all"},
	{Name: "--share-net"},
	{Name: "--unshare-user"},
	{Name: "--unshare-user-try"},
	{Name: "--unshare-ipc"},
	{Name: "--unshare-pid"},
	{Name: "--unshare-net"},
	{Name: "--unshare-uts"},
	{Name: "--unshare-cgroup"},
	{Name: "--unshare-cgroup-try"},
	{Name: "--userns", Args: f1},
	{Name: "--userns2", Args: f1},
	{Name: "--disable-userns"},
	{Name: "--assert-userns-disabled"},
	{Name: "--pidns", Args: f1},
	{Name: "--uid", Args: []ArgKind{ArgID}},
	{Name: "--gid", Args: []ArgKind{ArgID}},
	{Name: "--hostname", Args: s1},
	{Name: "--chdir", Args: s1},
	{Name: "--clearenv"},
	{Name: "--setenv", Args: s2},
	{Name: "--unsetenv", Args: s1},
	{Name: "--lock-file", Args: s1},
	{Name: "--sync-fd", Args: f1},
	{Name: "--bind", Args: s2},
	{Name: "--bind-try", Args: s2},
	{Name: "--dev-bind", Args: s2},
	{Name: "--dev-bind-try", Args: s2},
	{Name: "--ro-bind", Args: s2},
	{Name: "--ro-bind-try", Args: s2},
	{Name: "--bind-fd", Args: fdS},
	{Name: "--ro-bind-fd", Args: fdS},
	{Name: "--remount-ro", Args: s1},
	{Name: "--overlay-src", Args: s1},
	{Name: "--overlay", Args: []ArgKind{ArgString, ArgString, ArgString}},
	{Name: "--tmp-overlay", Args: s1},
	{Name: "--ro-overlay", Args: s1},
	{Name: "--exec-label", Args: s1},
	{Name: "--file-label", Args: s1},
	{Name: "--proc", Args: s1},
	{Name: "--dev", Args: s1},
	{Name: "--tmpfs", Args: s1, takesPerms: true, takesSize: true},
	{Name: "--mqueue", Args: s1},
	{Name: "--dir", Args: s1, takesPerms: true},
	{Name: "--file", Args: fdS, takesPerms: true},
	{Name: "--bind-data", Args: fdS, takesPerms: true},
	{Name: "--ro-bind-data", Args: fdS, takesPerms: true},
	{Name: "--symlink", Args: s2},
	{Name: "--seccomp", Args: f1},
	{Name: "--add-seccomp-fd", Args: f1},
	{Name: "--block-fd", Args: f1},
	{Name: "--userns-block-fd", Args: f1},
	{Name: "--info-fd", Args: f1},
	{Name: "--json-status-fd", Args: f1},
	{Name: "--new-session"},
	{Name: "--die-with-parent"},
	{Name: "--as-pid-1"},
	{Name: "--cap-add", Args: []ArgKind{ArgCap}},
	{Name: "--cap-drop", Args: []ArgKind{ArgCap}},
	{Name: "--perms", Args: []ArgKind{ArgOctal}, modifier: true},
	{Name: "--size", Args: []ArgKind{ArgSize}, modifier: true},
	{Name: "--chmod", Args: []ArgKind{ArgOctal, ArgString}},
}

// Options returns the names of every option Parse accepts, in the
// manual's order (--help, --version, --args first).
func Options() []string {
	names := []string{"--help", "--version", "--args"}
	for _, o := range options {
		names = append(names, o.Name)
	}
	return names
}

func lookup(name string) (Option, bool) {
	for _, o := range options {
		if o.Name == name {
			return o, true
		}
	}
	return Option{}, false
}

// Op is one option of the command line with its checked arguments, in
// the order given: filesystem operations are performed in this order.
type Op struct {
	Option string
	Args   []string
	// Numbers holds the parsed value of each ArgFD, ArgOctal, ArgID and
	// ArgSize argument, and ArgCap's mask (capMask), 0 for strings, index
	// for index with Args.
	Numbers []uint64
	// Perms is the --perms given right before the option (-1: none);
	// Size the --size (0: none).
	Perms int
	Size  uint64
}

// FD is the op's first descriptor argument.
func (o Op) FD() int { return int(o.Numbers[0]) }

// Command is a parsed bubblewrap command line.
type Command struct {
	Ops  []Op
	Argv []string // the command and its arguments
	// Help or Version: the caller asked for the usage text or the
	// version; nothing else on the line matters (bubblewrap prints and
	// exits at that option).
	Help, Version bool
	// overlaySrcs counts the --overlay-src not yet taken by an overlay
	// (they carry over an --args file's end, as bubblewrap's).
	overlaySrcs int
}

// UsageError is a malformed command line: bubblewrap prints the message
// and exits with status 1.
type UsageError struct {
	Option string // the option at fault ("" when none is)
	Msg    string
}

func (e *UsageError) Error() string { return e.Msg }

// ErrNoCommand: the line has no command after its options.
var ErrNoCommand = errors.New("no command given")

func usageErr(opt, format string, a ...any) error {
	return &UsageError{Option: opt, Msg: fmt.Sprintf(format, a...)}
}

// Parse reads a bubblewrap command line (without the program name).
// Options end at "--" or at the first argument not starting with '-'.
// readFD returns the whole content of a descriptor and closes it (for
// --args); nil refuses --args.
func Parse(args []string, readFD func(fd int) ([]byte, error)) (*Command, error) {
	c := &Command{}
	total := len(args)
	if total > MaxArgs {
		return nil, usageErr("", "Exceeded maximum number of arguments %d", MaxArgs)
	}
	rest, err := parseInto(c, args, readFD, false, &total)
	if err != nil {
		return nil, err
	}
	if c.Help || c.Version {
		return c, nil
	}
	if c.overlaySrcs > 0 {
		return nil, usageErr("--overlay-src", overlaySrcsMsg)
	}
	if len(rest) == 0 {
		return nil, ErrNoCommand
	}
	c.Argv = rest
	return c, nil
}

// parseInto appends the options of args to c and returns what follows
// them (the command). inFile: args came from --args, which may not nest.
func parseInto(c *Command, args []string, readFD func(int) ([]byte, error), inFile bool, total *int) ([]string, error) {
	perms, size := -1, uint64(0)
	for len(args) > 0 {
		arg := args[0]
		switch {
		case arg == "--help":
			c.Help = true
			return nil, nil
		case arg == "--version":
			c.Version = true
			return nil, nil
		case arg == "--":
			return args[1:], checkPending(perms, size)
		case arg == "--args":
			if inFile {
				return nil, usageErr(arg, "--args not supported in arguments file")
			}
			if len(args) < 2 {
				return nil, usageErr(arg, "--args takes an argument")
			}
			fd, err := parseNumber(args[1], 10)
			if err != nil || fd > 1<<31-1 {
				return nil, usageErr(arg, "Invalid fd: %s", args[1])
			}
			if readFD == nil {
				return nil, usageErr(arg, "--args: cannot read descriptor %d here", fd)
			}
			data, err := readFD(int(fd))
			if err != nil {
				return nil, usageErr(arg, "Can't read --args data from fd %d: %v", fd, err)
			}
			inner := splitNUL(data)
			*total += len(inner)
			if *total > MaxArgs {
				return nil, usageErr(arg, "Exceeded maximum number of arguments %d", MaxArgs)
			}
			// The file's arguments are parsed in place of "--args FD".
			// bubblewrap drops whatever follows a non-option in the file
			// (a command there is never run); str refuses it instead of
			// ignoring it.
			rest, err := parseInto(c, inner, readFD, true, total)
			if err != nil || c.Help || c.Version {
				return nil, err
			}
			if len(rest) > 0 {
				return nil, usageErr(arg, "--args %d: the file holds a non-option argument %q: only options may come from --args", fd, rest[0])
			}
			args = args[2:]
			continue
		case !strings.HasPrefix(arg, "-"):
			return args, checkPending(perms, size)
		}
		o, ok := lookup(arg)
		if !ok {
			return nil, usageErr(arg, "Unknown option %s", arg)
		}
		if len(args) < 1+len(o.Args) {
			return nil, usageErr(arg, "%s takes %s", arg, arity(len(o.Args)))
		}
		op := Op{Option: arg, Args: append([]string(nil), args[1:1+len(o.Args)]...), Numbers: make([]uint64, len(o.Args)), Perms: -1}
		for i, k := range o.Args {
			n, err := checkArg(arg, k, op.Args[i])
			if err != nil {
				return nil, err
			}
			op.Numbers[i] = n
		}
		args = args[1+len(o.Args):]
		if err := checkOverlaySrcs(c, arg); err != nil {
			return nil, err
		}
		switch {
		case arg == "--perms":
			if perms != -1 {
				return nil, usageErr(arg, "--perms given twice for the same action")
			}
			perms = int(op.Numbers[0])
			continue
		case arg == "--size":
			if size != 0 {
				return nil, usageErr(arg, "--size given twice for the same action")
			}
			size = op.Numbers[0]
			continue
		}
		if perms != -1 {
			if !o.takesPerms {
				return nil, usageErr("--perms", "--perms must be followed by an option that creates a file")
			}
			op.Perms, perms = perms, -1
		}
		if size != 0 {
			if !o.takesSize {
				return nil, usageErr("--size", "--size must be followed by --tmpfs")
			}
			op.Size, size = size, 0
		}
		c.Ops = append(c.Ops, op)
	}
	return nil, checkPending(perms, size)
}

// overlaySrcsMsg is bubblewrap's word for an --overlay-src not followed
// by an overlay.
const overlaySrcsMsg = "--overlay-src must be followed by another --overlay-src or one of --overlay, --tmp-overlay, or --ro-overlay"

// checkOverlaySrcs applies bubblewrap's rules to the --overlay-src before
// opt: an overlay takes them all (--overlay and --tmp-overlay need one,
// --ro-overlay two: it has no writable layer); any other option may not
// follow one.
func checkOverlaySrcs(c *Command, opt string) error {
	need := 1
	switch opt {
	case "--overlay-src":
		c.overlaySrcs++
		return nil
	case "--ro-overlay":
		need = 2
	case "--overlay", "--tmp-overlay":
	default:
		if c.overlaySrcs > 0 {
			return usageErr("--overlay-src", overlaySrcsMsg)
		}
		return nil
	}
	if c.overlaySrcs < need {
		return usageErr(opt, "%s requires at least %s --overlay-src", opt, map[int]string{1: "one", 2: "two"}[need])
	}
	c.overlaySrcs = 0
	return nil
}

// checkPending refuses a modifier left with no option to apply to.
func checkPending(perms int, size uint64) error {
	if perms != -1 {
		return usageErr("--perms", "--perms must be followed by an option that creates a file")
	}
	if size != 0 {
		return usageErr("--size", "--size must be followed by --tmpfs")
	}
	return nil
}

func arity(n int) string {
	switch n {
	case 1:
		return "an argument"
	case 2:
		return "two arguments"
	}
	return "three arguments"
}

func checkArg(opt string, k ArgKind, s string) (uint64, error) {
	switch k {
	case ArgFD:
		n, err := parseNumber(s, 10)
		if err != nil || n > 1<<31-1 {
			return 0, usageErr(opt, "Invalid fd: %s", s)
		}
		return n, nil
	case ArgOctal:
		n, err := parseNumber(s, 8)
		if err != nil || n > 0o7777 {
			return 0, usageErr(opt, "%s takes an octal argument <= 07777", opt)
		}
		return n, nil
	case ArgID:
		n, err := parseNumber(s, 10)
		if err != nil || n > 1<<32-2 {
			return 0, usageErr(opt, "Invalid %s: %s", strings.TrimPrefix(opt, "--"), s)
		}
		return n, nil
	case ArgCap:
		mask, ok := capMask(s)
		if !ok {
			return 0, usageErr(opt, "unknown cap: %s", s)
		}
		return mask, nil
	case ArgSize:
		n, err := strconv.ParseUint(s, 0, 64)
		if err != nil || n == 0 || strings.HasPrefix(s, "-") {
			return 0, usageErr(opt, "--size takes a non-zero number of bytes")
		}
		if n > MaxTmpfsBytes {
			return 0, usageErr(opt, "--size (for tmpfs) is limited to %d", MaxTmpfsBytes)
		}
		return n, nil
	}
	return 0, nil
}

// parseNumber accepts only digits of the base: no sign, no space, no
// empty string.
func parseNumber(s string, base int) (uint64, error) {
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseUint(s, base, 64)
}

// splitNUL splits --args data: each argument ends with a NUL; a last one
// without its NUL still counts.
func splitNUL(data []byte) []string {
	var out []string
	for len(data) > 0 {
		i := strings.IndexByte(string(data), 0)
		if i < 0 {
			out = append(out, string(data))
			break
		}
		out = append(out, string(data[:i]))
		data = data[i+1:]
	}
	return out
}

// capNames are Linux's capabilities (capability.h, 0 to 40), without
// their CAP_ prefix.
var capNames = []string{"chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid", "setuid",
	"setpcap", "linux_immutable", "net_bind_service", "net_broadcast", "net_admin", "net_raw", "ipc_lock",
	"ipc_owner", "sys_module", "sys_rawio", "sys_chroot", "sys_ptrace", "sys_pacct", "sys_admin", "sys_boot",
	"sys_nice", "sys_resource", "sys_time", "sys_tty_config", "mknod", "lease", "audit_write", "audit_control",
	"setfcap", "mac_override", "mac_admin", "syslog", "wake_alarm", "block_suspend", "audit_read", "perfmon",
	"bpf", "checkpoint_restore"}

// capMask reads ALL or a capability's name, with or without CAP_, in any
// case, as a mask (bit n: capability n; ALL: every one of capNames).
func capMask(s string) (uint64, bool) {
	l := strings.ToLower(s)
	if l == "all" {
		return 1<<len(capNames) - 1, true
	}
	l = strings.TrimPrefix(l, "cap_")
	for i, n := range capNames {
		if n == l {
			return 1 << i, true
		}
	}
	return 0, false
}
