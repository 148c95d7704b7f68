package bwrap

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// sample is a valid argument of each kind and the number it parses to.
func sample(k ArgKind, i int) (string, uint64) {
	switch k {
	case ArgFD:
		return fmt.Sprint(10 + i), uint64(10 + i)
	case ArgOctal:
		return "0750", 0o750
	case ArgID:
		return "1234", 1234
	case ArgSize:
		return "0x1000", 4096
	case ArgCap:
		return "CAP_NET_RAW", 1 << 13 // its mask
	}
	return fmt.Sprintf("/arg%d", i), 0
}

func noFD(int) ([]byte, error) { return nil, errors.New("no descriptors in this test") }

// Every option of the list parses with its arguments, in order, and the
// command after it is kept whole.
func TestParseEveryOption(t *testing.T) {
	for _, o := range options {
		t.Run(o.Name, func(t *testing.T) {
			line := []string{o.Name}
			var want []string
			var nums []uint64
			for i, k := range o.Args {
				s, n := sample(k, i)
				line, want, nums = append(line, s), append(want, s), append(nums, n)
			}
			if o.Name == "--perms" {
				line = append(line, "--dir", "/d")
			}
			if o.Name == "--size" {
				line = append(line, "--tmpfs", "/t")
			}
			switch o.Name {
			case "--overlay-src":
				line = append(line, "--tmp-overlay", "/o")
			case "--overlay", "--tmp-overlay", "--ro-overlay":
				line = append([]string{"--overlay-src", "/l1", "--overlay-src", "/l2"}, line...)
			}
			line = append(line, "cmd", "--not-an-option", "x")
			c, err := Parse(line, noFD)
			if err != nil {
				t.Fatalf("Parse(%q): %v", line, err)
			}
			if !slices.Equal(c.Argv, []string{"cmd", "--not-an-option", "x"}) {
				t.Errorf("argv %q", c.Argv)
			}
			ops := c.Ops
			switch o.Name {
			case "--overlay-src":
				ops = ops[:len(ops)-1] // the overlay that takes it
			case "--overlay", "--tmp-overlay", "--ro-overlay":
				ops = ops[2:] // the sources it takes
			}
			if len(ops) != 1 {
				t.Fatalf("ops %+v, want one", c.Ops)
			}
			op := ops[0]
			switch o.Name {
			case "--perms":
				if op.Option != "--dir" || op.Perms != 0o750 {
					t.Errorf("--perms 0750 --dir: %+v", op)
				}
			case "--size":
				if op.Option != "--tmpfs" || op.Size != 4096 {
					t.Errorf("--size 0x1000 --tmpfs: %+v", op)
				}
			default:
				if op.Option != o.Name || !slices.Equal(op.Args, want) || !slices.Equal(op.Numbers, nums) || op.Perms != -1 || op.Size != 0 {
					t.Errorf("op %+v, want %s %q %v", op, o.Name, want, nums)
				}
			}
		})
	}
}

// An option short of its arguments is an error naming it, as is every
// malformed number.
func TestParseMissingArgument(t *testing.T) {
	for _, o := range options {
		if len(o.Args) == 0 {
			continue
		}
		line := []string{"--unshare-pid", o.Name}
		for i := range o.Args[:len(o.Args)-1] {
			s, _ := sample(o.Args[i], i)
			line = append(line, s)
		}
		_, err := Parse(line, noFD)
		var ue *UsageError
		if !errors.As(err, &ue) || ue.Option != o.Name || !strings.Contains(ue.Msg, o.Name+" takes") {
			t.Errorf("Parse(%q) = %v, want a usage error naming %s", line, err, o.Name)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		line   []string
		option string
		msg    string
	}{
		{[]string{"--frobnicate", "cmd"}, "--frobnicate", "Unknown option --frobnicate"},
		{[]string{"-x", "cmd"}, "-x", "Unknown option -x"},
		{[]string{"--info-fd", "x", "cmd"}, "--info-fd", "Invalid fd: x"},
		{[]string{"--info-fd", "-1", "cmd"}, "--info-fd", "Invalid fd: -1"},
		{[]string{"--sync-fd", "", "cmd"}, "--sync-fd", "Invalid fd: "},
		{[]string{"--file", "3a", "/f", "cmd"}, "--file", "Invalid fd: 3a"},
		{[]string{"--args", "nine", "cmd"}, "--args", "Invalid fd: nine"},
		{[]string{"--args"}, "--args", "--args takes an argument"},
		{[]string{"--uid", "root", "cmd"}, "--uid", "Invalid uid: root"},
		{[]string{"--gid", "-5", "cmd"}, "--gid", "Invalid gid: -5"},
		{[]string{"--chmod", "0999", "/x", "cmd"}, "--chmod", "--chmod takes an octal argument <= 07777"},
		{[]string{"--perms", "17777", "--dir", "/d", "cmd"}, "--perms", "--perms takes an octal argument <= 07777"},
		{[]string{"--perms", "0700", "--perms", "0700", "--dir", "/d", "cmd"}, "--perms", "--perms given twice for the same action"},
		{[]string{"--perms", "0700", "--bind", "/a", "/b", "cmd"}, "--perms", "--perms must be followed by an option that creates a file"},
		{[]string{"--perms", "0700", "cmd"}, "--perms", "--perms must be followed by an option that creates a file"},
		{[]string{"--size", "0", "--tmpfs", "/t", "cmd"}, "--size", "--size takes a non-zero number of bytes"},
		{[]string{"--size", "12", "--dir", "/d", "cmd"}, "--size", "--size must be followed by --tmpfs"},
		{[]string{"--size", "12", "--size", "12", "--tmpfs", "/t", "cmd"}, "--size", "--size given twice for the same action"},
		{[]string{"--cap-drop", "CAP_FLY", "cmd"}, "--cap-drop", "unknown cap: CAP_FLY"},
		{[]string{"--cap-add", "", "cmd"}, "--cap-add", "unknown cap: "},
		// bubblewrap's own bogus sizes (its test-run.sh), 0 included: its
		// --tmpfs with size 0 is refused, not an unlimited tmpfs.
		{[]string{"--size", "123bogus", "--tmpfs", "/t", "cmd"}, "--size", "--size takes a non-zero number of bytes"},
		{[]string{"--size", "", "--tmpfs", "/t", "cmd"}, "--size", "--size takes a non-zero number of bytes"},
		{[]string{"--size", "-12345678", "--tmpfs", "/t", "cmd"}, "--size", "--size takes a non-zero number of bytes"},
		{[]string{"--size", " -12345678", "--tmpfs", "/t", "cmd"}, "--size", "--size takes a non-zero number of bytes"},
		{[]string{"--size", "18446744073709551616", "--tmpfs", "/t", "cmd"}, "--size", "--size takes a non-zero number of bytes"},
		{[]string{"--size", "9223372036854775809", "--tmpfs", "/t", "cmd"}, "--size", "--size (for tmpfs) is limited to 9223372036854775807"},
		// The overlays' sources, bubblewrap's rules and words.
		{[]string{"--overlay", "u", "w", "/tmp", "cmd"}, "--overlay", "--overlay requires at least one --overlay-src"},
		{[]string{"--tmp-overlay", "/tmp", "cmd"}, "--tmp-overlay", "--tmp-overlay requires at least one --overlay-src"},
		{[]string{"--ro-overlay", "/tmp", "cmd"}, "--ro-overlay", "--ro-overlay requires at least two --overlay-src"},
		{[]string{"--overlay-src", "l", "--ro-overlay", "/tmp", "cmd"}, "--ro-overlay", "--ro-overlay requires at least two --overlay-src"},
		{[]string{"--overlay-src", "/tmp", "cmd"}, "--overlay-src", overlaySrcsMsg},
		{[]string{"--overlay-src", "/tmp", "--", "cmd"}, "--overlay-src", overlaySrcsMsg},
		{[]string{"--overlay-src", "/tmp", "--chdir", "/", "cmd"}, "--overlay-src", overlaySrcsMsg},
		{[]string{"--overlay-src", "l", "--tmp-overlay", "/a", "--overlay-src", "m", "--ro-overlay", "/b", "cmd"}, "--ro-overlay", "--ro-overlay requires at least two --overlay-src"},
	} {
		_, err := Parse(tc.line, noFD)
		var ue *UsageError
		if !errors.As(err, &ue) || ue.Option != tc.option || ue.Msg != tc.msg {
			t.Errorf("Parse(%q) = %v, want %s: %q", tc.line, err, tc.option, tc.msg)
		}
	}
	if _, err := Parse([]string{"--unshare-pid"}, noFD); !errors.Is(err, ErrNoCommand) {
		t.Errorf("no command: %v", err)
	}
	if _, err := Parse([]string{"--unshare-pid", "--"}, noFD); !errors.Is(err, ErrNoCommand) {
		t.Errorf("nothing after --: %v", err)
	}
}

// "--" ends the options: what follows is the command even if it looks
// like an option; options keep their order.
func TestParseOrderAndDoubleDash(t *testing.T) {
	c, err := Parse([]string{"--ro-bind", "/", "/", "--proc", "/proc", "--tmpfs", "/tmp", "--", "--help", "-x"}, noFD)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range c.Ops {
		got = append(got, op.Option)
	}
	if !slices.Equal(got, []string{"--ro-bind", "--proc", "--tmpfs"}) || !slices.Equal(c.Argv, []string{"--help", "-x"}) || c.Help {
		t.Errorf("ops %q argv %q help %v", got, c.Argv, c.Help)
	}
}

func TestParseCapNames(t *testing.T) {
	for _, name := range []string{"ALL", "all", "CAP_SYS_ADMIN", "sys_admin", "Cap_Checkpoint_Restore", "chown"} {
		if _, err := Parse([]string{"--cap-drop", name, "cmd"}, noFD); err != nil {
			t.Errorf("--cap-drop %s: %v", name, err)
		}
	}
	if len(capNames) != 41 {
		t.Errorf("%d capability names, want 41 (CAP_CHOWN..CAP_CHECKPOINT_RESTORE)", len(capNames))
	}
}

func TestParseHelpVersion(t *testing.T) {
	for _, tc := range []struct {
		line          []string
		help, version bool
	}{
		{[]string{"--help"}, true, false},
		{[]string{"--unshare-pid", "--version", "--frobnicate"}, false, true},
		{[]string{"--version", "--help"}, false, true},
	} {
		c, err := Parse(tc.line, noFD)
		if err != nil || c.Help != tc.help || c.Version != tc.version {
			t.Errorf("Parse(%q) = %+v, %v", tc.line, c, err)
		}
	}
}

// --args FD: NUL-separated arguments read in place; no nesting.
func TestParseArgs(t *testing.T) {
	files := map[int]string{
		5: "--unshare-pid\x00--setenv\x00A\x00b c\x00--tmpfs\x00/tmp", // last without its NUL
		6: "--args\x005\x00",
		7: "--bogus\x00",
		9: "--unshare-pid\x00cmd\x00",
	}
	read := func(fd int) ([]byte, error) {
		s, ok := files[fd]
		if !ok {
			return nil, errors.New("bad file descriptor")
		}
		return []byte(s), nil
	}
	c, err := Parse([]string{"--die-with-parent", "--args", "5", "--chdir", "/w", "cmd", "a"}, read)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range c.Ops {
		got = append(got, op.Option+" "+strings.Join(op.Args, " "))
	}
	want := []string{"--die-with-parent ", "--unshare-pid ", "--setenv A b c", "--tmpfs /tmp", "--chdir /w"}
	if !slices.Equal(got, want) || !slices.Equal(c.Argv, []string{"cmd", "a"}) {
		t.Errorf("ops %q argv %q, want %q", got, c.Argv, want)
	}
	for fd, msg := range map[string]string{
		"6": "--args not supported in arguments file",
		"7": "Unknown option --bogus",
		"4": "Can't read --args data from fd 4: bad file descriptor",
		"9": "--args 9: the file holds a non-option argument \"cmd\": only options may come from --args",
	} {
		_, err := Parse([]string{"--args", fd, "cmd"}, read)
		if err == nil || err.Error() != msg {
			t.Errorf("--args %s: %v, want %q", fd, err, msg)
		}
	}
	files[8] = strings.Repeat("--unshare-pid\x00", MaxArgs)
	if _, err := Parse([]string{"--args", "8", "cmd"}, read); err == nil || !strings.Contains(err.Error(), "Exceeded maximum number of arguments") {
		t.Errorf("--args over the limit: %v", err)
	}
}
