package bwrap

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/securetoolruntime/str/nsinit"
)

// Host is what the translation needs to know about the caller and the
// host's files. Tests fill it by hand.
type Host struct {
	UID, GID int      // the caller's real ids (bubblewrap keeps them inside by default)
	Environ  []string // the caller's environment (bubblewrap passes it on)
	Cwd      string   // the caller's working directory
	Hostname string   // the host's name (a new UTS namespace starts with it)
	Lstat    func(string) (fs.FileInfo, error)
	Stat     func(string) (fs.FileInfo, error)
	ReadDir  func(string) ([]fs.DirEntry, error)
	Readlink func(string) (string, error)
	// Root is str's root mode (procfs.RootMode): the launcher leases ids
	// and maps host root to the sandbox's root (Sandbox.MapRoot). A uid 0
	// caller in a user namespace that maps one id is not root mode.
	Root bool
	// Caps is the caller's effective capability set (a uid 0 caller's
	// are where bubblewrap starts: Sandbox.RootCaps).
	Caps uint64
	// ReadFD returns the whole content of a descriptor (--file).
	ReadFD func(fd int) ([]byte, error)
}

// Sandbox is what a bubblewrap command line asks of str's launcher, in
// the launcher's terms.
type Sandbox struct {
	Mounts   []nsinit.Mount // the filesystem, in the command line's order
	Argv     []string
	Argv0    string   // the command's argv[0]: --argv0, else Argv[0] as given (bubblewrap's execvp keeps it)
	Env      []string // the tool's whole environment
	Workdir  string   // the tool's working directory inside
	UID, GID uint32   // seen inside
	Hostname string   // --hostname, else the host's own (what a new UTS namespace starts with)
	// ShareNet: the command line did not unshare the network; str puts
	// the sandbox on the caller's network, as bubblewrap, when the
	// profile allows it (share_caller_network), else gives it the
	// profile's egress policy through its proxy, in a namespace of its own.
	ShareNet bool
	// InfoFD, JSONStatusFD: where the sandbox's information goes (-1: nowhere).
	InfoFD, JSONStatusFD int
	// SyncFDs are held open by str for the sandbox's life (--sync-fd).
	SyncFDs []int
	// RootBound: the line binds a directory over / (its root is that
	// bind under bubblewrap, not a tmpfs of the command's).
	RootBound bool
	// BlockFD: the command starts only once it has data to read or is
	// closed (--block-fd; -1 none; the last one given counts, as
	// bubblewrap's).
	BlockFD int
	// UsernsBlockFD (--userns-block-fd; -1 none): the setup goes on only
	// once it has data or is closed, after --info-fd is written (where
	// bubblewrap waits for its caller to write the user namespace's maps,
	// which str has written already).
	UsernsBlockFD int
	// UsernsDisabled (--disable-userns): the tool must be unable to make
	// user namespaces: the profile's seccomp policy refuses every way
	// (CheckUsernsDenied), or str stacks UsernsFilter on its filters.
	UsernsDisabled bool
	// UsernsAsserted (--assert-userns-disabled): the line checks that the
	// tool cannot make user namespaces without disabling them itself: str
	// refuses the line unless the profile's policy refuses every way or
	// the line also says --disable-userns.
	UsernsAsserted bool
	// DieWithParent: str itself ends (and its sandbox with it) when its
	// parent does.
	DieWithParent bool
	// LockFiles are the host files behind --lock-file's paths: str holds
	// a read lock (F_SETLK, F_RDLCK) on each for the sandbox's life, as
	// bubblewrap's pid 1 does inside; the file is the same inode.
	LockFiles []string
	// Seccomp are the caller's classic-BPF programs (--seccomp,
	// --add-seccomp-fd), installed after the profile's filter, never
	// instead of it.
	Seccomp [][]byte
	// Caps are the capabilities the command keeps (bit n: capability n):
	// --cap-add and --cap-drop in the line's order, applied to none.
	// They are its user namespace's only: the sandbox's, never the host's.
	Caps uint64
	// RootCaps are the same applied to the caller's own effective set
	// (Host.Caps) when the caller is uid 0, as bubblewrap run by root
	// starts from them; none when the command's uid is not 0 and the line
	// sets none. str keeps them instead of Caps only where the profile
	// says root_capabilities: keep (profiles.Profile.RootCapabilities).
	RootCaps uint64
	// CapsSet: the line adds or drops capabilities, so the kept ones are
	// also inheritable and ambient (bubblewrap's capset); without, a root
	// caller's stay effective and permitted only, as under bubblewrap,
	// which leaves them as they are.
	CapsSet bool
	// UserNS, PidNS: the descriptors of the namespaces the sandbox joins
	// instead of making its own (--userns, --pidns; -1 none):
	// launcher.Plan.JoinNamespaces.
	UserNS, PidNS int
	// MapRoot: the caller is root, so every bind not mapped to its owner
	// (Mount.IDMapOwner) shows host root's files as the sandbox's root's
	// (launcher.Plan.MapRoot), as they are the command's under bubblewrap
	// run by root.
	MapRoot bool
}

// Unsupported is an option str cannot honour exactly (yet): it is an
// error, never silently dropped.
type Unsupported struct {
	Option string
	Why    string
}

func (e *Unsupported) Error() string { return e.Option + ": not supported by str bwrap: " + e.Why }

// MaxSeccompInsns is the kernel's BPF_MAXINSNS: the longest program
// --seccomp and --add-seccomp-fd accept.
const MaxSeccompInsns = 4096

// SeccompReadError is a --seccomp or --add-seccomp-fd descriptor that
// cannot be read; its message starts with bubblewrap's words.
type SeccompReadError struct {
	Option string
	FD     int
	Err    error
}

func (e *SeccompReadError) Error() string {
	return fmt.Sprintf("Can't read seccomp data: %v (%s %d)", e.Err, e.Option, e.FD)
}

func (e *SeccompReadError) Unwrap() error { return e.Err }

// SourceError is a bind source that cannot be found. Its message starts
// with bubblewrap's own words, which callers match ("Can't find source
// path"), and names the option.
type SourceError struct {
	Option, Path string
	Err          error
}

func (e *SourceError) Error() string {
	return "Can't find source path " + e.Path + ": " + e.Err.Error() + " (" + e.Option + " " + e.Path + ")"
}

func (e *SourceError) Unwrap() error { return e.Err }

// refused lists every option str refuses, with the reason.
var refused = map[string]string{
	"--userns2":    joinNS2,
	"--exec-label": "str does not set SELinux labels",
	"--file-label": "str does not set SELinux labels",
}

// joinNS2 is why --userns2 is refused.
const joinNS2 = "str's init joins no second user namespace after its mounts (--userns and --pidns are honoured: docs/bwrap.md)"

// Translate maps a parsed command line onto str's terms: every option
// str honours becomes part of the Sandbox, every other is an
// *Unsupported error (all of them, joined).
func Translate(c *Command, h Host) (*Sandbox, error) {
	var errs []error
	for _, op := range c.Ops {
		if why, ok := refused[op.Option]; ok {
			errs = append(errs, &Unsupported{Option: op.Option, Why: why})
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	// --seccomp and --add-seccomp-fd do not mix: bubblewrap stops at the
	// second, naming it first, before it reads any program.
	firstSeccomp := ""
	for _, op := range c.Ops {
		if op.Option != "--seccomp" && op.Option != "--add-seccomp-fd" {
			continue
		}
		if firstSeccomp != "" && op.Option != firstSeccomp {
			return nil, &UsageError{Option: op.Option, Msg: op.Option + " cannot be combined with " + firstSeccomp}
		}
		firstSeccomp = op.Option
	}

	sb := &Sandbox{Argv: append([]string(nil), c.Argv...), Argv0: c.Argv[0], UID: uint32(h.UID), GID: uint32(h.GID), Hostname: h.Hostname, InfoFD: -1, JSONStatusFD: -1, BlockFD: -1, UsernsBlockFD: -1, UserNS: -1, PidNS: -1, ShareNet: true, MapRoot: h.Root}
	userns := h.UID != 0 // bubblewrap not setuid: a user namespace is implied for a non-root caller
	uts, pidns := false, false
	if h.UID == 0 {
		sb.RootCaps = h.Caps
	}
	var uidSet, gidSet, hostnameSet, asPid1, unshareUser, unshareUserTry bool
	env := append([]string(nil), h.Environ...)
	chdir := ""
	for _, op := range c.Ops {
		switch op.Option {
		case "--unshare-all":
			userns, uts, pidns, sb.ShareNet, unshareUserTry = true, true, true, false, true
		case "--unshare-pid":
			pidns = true
		case "--unshare-user", "--unshare-user-try":
			userns = true
			unshareUser = unshareUser || op.Option == "--unshare-user"
			unshareUserTry = unshareUserTry || op.Option == "--unshare-user-try"
		case "--userns":
			sb.UserNS = op.FD()
		case "--pidns":
			sb.PidNS = op.FD()
		case "--unshare-uts":
			uts = true
		case "--unshare-net":
			sb.ShareNet = false
		case "--share-net":
			sb.ShareNet = true
		case "--uid":
			sb.UID, uidSet = uint32(op.Numbers[0]), true
		case "--gid":
			sb.GID, gidSet = uint32(op.Numbers[0]), true
		case "--hostname":
			sb.Hostname, hostnameSet = op.Args[0], true
		case "--chdir":
			chdir = op.Args[0]
		case "--clearenv":
			env = clearEnv(env)
		case "--setenv":
			env = setEnv(env, op.Args[0], op.Args[1])
		case "--unsetenv":
			env = unsetEnv(env, op.Args[0])
		case "--info-fd":
			sb.InfoFD = op.FD()
		case "--json-status-fd":
			sb.JSONStatusFD = op.FD()
		case "--sync-fd":
			sb.SyncFDs = append(sb.SyncFDs, op.FD())
		case "--block-fd":
			sb.BlockFD = op.FD()
		case "--userns-block-fd":
			sb.UsernsBlockFD = op.FD()
		case "--argv0":
			sb.Argv0 = op.Args[0]
		case "--seccomp", "--add-seccomp-fd":
			prog, err := h.ReadFD(op.FD())
			if err != nil {
				errs = append(errs, &SeccompReadError{Option: op.Option, FD: op.FD(), Err: err})
				continue
			}
			switch {
			case len(prog)%8 != 0: // bubblewrap's words, which its callers match
				errs = append(errs, &UsageError{Option: op.Option, Msg: "Invalid seccomp data, must be multiple of 8"})
				continue
			case len(prog) == 0 || len(prog)/8 > MaxSeccompInsns:
				errs = append(errs, &UsageError{Option: op.Option, Msg: fmt.Sprintf("Invalid seccomp data from %s %d: %d instructions, must be 1 to %d", op.Option, op.FD(), len(prog)/8, MaxSeccompInsns)})
				continue
			}
			sb.Seccomp = append(sb.Seccomp, prog)
		case "--cap-add":
			sb.Caps, sb.RootCaps, sb.CapsSet = sb.Caps|op.Numbers[0], sb.RootCaps|op.Numbers[0], true
		case "--cap-drop":
			sb.Caps, sb.RootCaps, sb.CapsSet = sb.Caps&^op.Numbers[0], sb.RootCaps&^op.Numbers[0], true
		case "--die-with-parent":
			sb.DieWithParent = true
		case "--as-pid-1":
			asPid1 = true
		case "--disable-userns":
			sb.UsernsDisabled = true
		case "--assert-userns-disabled":
			sb.UsernsAsserted = true
		}
	}
	if !sb.CapsSet && sb.UID != 0 { // bubblewrap's uid change drops a root caller's
		sb.RootCaps = 0
	}
	// --userns, --pidns: bubblewrap's rules, with its words; and str's
	// own: a pid namespace is joined only with the user namespace that
	// has a say over it, and none is made inside a joined one.
	if sb.UserNS >= 0 {
		userns = true // --uid, --gid name ids of the joined namespace
		if unshareUser {
			errs = append(errs, &UsageError{Option: "--userns", Msg: "--userns not compatible --unshare-user"})
		}
		if unshareUserTry {
			errs = append(errs, &UsageError{Option: "--userns", Msg: "--userns not compatible --unshare-user-try"})
		}
	}
	if sb.PidNS >= 0 && sb.UserNS < 0 {
		errs = append(errs, &Unsupported{Option: "--pidns", Why: "it needs --userns: str's sandbox is otherwise in a user namespace of its own, which has no privilege over another's pid namespace"})
	}
	if sb.PidNS >= 0 && pidns {
		errs = append(errs, &Unsupported{Option: "--pidns", Why: "with --unshare-pid it asks for a pid namespace inside the joined one, which takes a second fork str's init does not make"})
	}
	// bubblewrap's own consistency rules, with its words.
	if uidSet && int(sb.UID) != h.UID && !userns {
		errs = append(errs, &UsageError{Option: "--uid", Msg: "Specifying --uid requires --unshare-user or --userns"})
	}
	if gidSet && int(sb.GID) != h.GID && !userns {
		errs = append(errs, &UsageError{Option: "--gid", Msg: "Specifying --gid requires --unshare-user or --userns"})
	}
	if hostnameSet && !uts {
		errs = append(errs, &UsageError{Option: "--hostname", Msg: "Specifying --hostname requires --unshare-uts"})
	}
	if asPid1 && !pidns {
		errs = append(errs, &UsageError{Option: "--as-pid-1", Msg: "Specifying --as-pid-1 requires --unshare-pid"})
	}
	if sb.UsernsDisabled && !userns {
		errs = append(errs, &UsageError{Option: "--disable-userns", Msg: "--disable-userns requires --unshare-user"})
	}
	// --userns-block-fd: an explicit --unshare-user (not the implied one,
	// nor --unshare-all's -try), and --info-fd (the caller learns the pid
	// there), and not with --disable-userns.
	switch {
	case sb.UsernsBlockFD < 0:
	case !unshareUser:
		errs = append(errs, &UsageError{Option: "--userns-block-fd", Msg: "--userns-block-fd requires --unshare-user"})
	case sb.InfoFD < 0:
		errs = append(errs, &UsageError{Option: "--userns-block-fd", Msg: "--userns-block-fd requires --info-fd"})
	case sb.UsernsDisabled:
		errs = append(errs, &UsageError{Option: "--userns-block-fd", Msg: "--disable-userns is not compatible with  --userns-block-fd"})
	}

	mounts, err := translateMounts(c.Ops, h, sb.UID, sb.GID)
	if err != nil {
		errs = append(errs, err)
	}
	for _, op := range c.Ops {
		switch op.Option {
		case "--bind", "--bind-try", "--ro-bind", "--ro-bind-try", "--bind-fd", "--ro-bind-fd", "--dev-bind", "--dev-bind-try":
			if insidePath(op.Args[1]) == "/" {
				sb.RootBound = true
			}
		}
	}
	for _, op := range c.Ops {
		if op.Option != "--lock-file" {
			continue
		}
		if asPid1 {
			errs = append(errs, &UsageError{Option: "--lock-file", Msg: "Specifying --as-pid-1 and --lock-file is not permitted"})
			break
		}
		p := insidePath(op.Args[0])
		host, ok := hostFileOf(mounts, p)
		if !ok {
			errs = append(errs, &Unsupported{Option: "--lock-file", Why: fmt.Sprintf("%s is not under a bind: str holds the lock from outside the sandbox, on the host file a bind shows", p)})
			continue
		}
		sb.LockFiles = append(sb.LockFiles, host)
	}
	// str's promise holds under a bubblewrap line too: service-account
	// tokens and similar secrets are never visible, whatever is bound
	// (the launcher's own plan does the same for profiles). An empty
	// read-only tmpfs goes over each such directory the binds show.
	for _, dir := range SecretDirs {
		if boundDir(mounts, dir, h) {
			mounts = append(mounts, nsinit.Mount{Kind: nsinit.MountTmpfs, Target: dir, ReadOnly: true, Data: "size=4k,mode=0755"})
		}
	}
	sb.Mounts = mounts
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	// The working directory: --chdir, else the caller's own if the
	// sandbox shows it, else $HOME if shown, else / (bubblewrap's order).
	// PWD names it, as bubblewrap sets it.
	switch {
	case chdir != "":
		sb.Workdir = insidePath(chdir)
	case h.Cwd != "" && visibleDir(mounts, h.Cwd, h):
		sb.Workdir = h.Cwd
	case getEnv(env, "HOME") != "" && visibleDir(mounts, getEnv(env, "HOME"), h):
		sb.Workdir = getEnv(env, "HOME")
	default:
		sb.Workdir = "/"
	}
	env = setEnv(env, "PWD", sb.Workdir)
	sb.Env = env
	return sb, nil
}

// translateMounts turns the filesystem options into the init's mount
// steps, in the command line's order.
//
// A tmpfs belongs to the command's uid and gid inside, as bubblewrap's
// do (its setup runs as the sandbox's ids): the uid= and gid= options,
// read in the init's user namespace, where those ids are always mapped.
func translateMounts(ops []Op, h Host, uid, gid uint32) ([]nsinit.Mount, error) {
	owner := fmt.Sprintf(",uid=%d,gid=%d", uid, gid)
	var ms []nsinit.Mount
	var errs []error
	// links are the symlinks the line makes (and a bind over / recreates):
	// a later destination through one of them is where bubblewrap's mount
	// lands, which follows it inside the new root; the init follows none.
	links := map[string]string{}
	dest := func(p string) string { return resolveLinks(insidePath(p), links) }
	var lowers []string // the --overlay-src before an overlay, host paths, in the line's order
	for i, op := range ops {
		switch op.Option {
		case "--bind", "--bind-try", "--ro-bind", "--ro-bind-try", "--bind-fd", "--ro-bind-fd", "--dev-bind", "--dev-bind-try":
			src, dst := hostPath(op.Args[0], h.Cwd), dest(op.Args[1])
			if strings.HasSuffix(op.Option, "-fd") {
				// The descriptor's own file, as bubblewrap names it: the
				// magic link opens what the descriptor holds, whatever
				// is at its path now (the launcher's clone opens it in
				// this process, the only one that holds the descriptor).
				src = fmt.Sprintf("/proc/self/fd/%d", op.FD())
			}
			ro := strings.HasPrefix(op.Option, "--ro-")
			try := strings.HasSuffix(op.Option, "-try")
			// --dev-bind: without nodev, the one bind whose device nodes
			// the tool may open (those its ids may, on a filesystem the
			// kernel lets a user namespace use devices of).
			devices := strings.HasPrefix(op.Option, "--dev-")
			fi, err := h.Stat(src)
			if err != nil {
				if try && errors.Is(err, fs.ErrNotExist) {
					continue
				}
				cause := err
				var pe *fs.PathError
				if errors.As(err, &pe) {
					cause = pe.Err
				}
				errs = append(errs, &SourceError{Option: op.Option, Path: op.Args[0], Err: cause})
				continue
			}
			if dst != "/" {
				// A writable bind, root mode, whose owner is not root:
				// the tree is id-mapped to make its owner the tool (the
				// tool writes where the owner may, its files are the
				// owner's). Every other bind of a root caller is mapped
				// host root -> the sandbox's root (Sandbox.MapRoot).
				idmap := !ro && h.Root && !rootOwned(fi)
				ms = append(ms, nsinit.Mount{Kind: nsinit.MountBind, Source: src, Target: dst, ReadOnly: ro, IDMapOwner: idmap, Devices: devices})
				continue
			}
			// A bind over the whole root. str's root is its own tmpfs
			// (read-only once set up), so it gets each top-level entry of
			// the source instead: directories and files bound, symlinks
			// recreated. Entries a later op mounts over exactly are left
			// out (they would be hidden). Whatever the line mounted or made
			// before is hidden under bubblewrap's bind: it is dropped.
			ms, links = nil, map[string]string{}
			if !fi.IsDir() {
				errs = append(errs, fmt.Errorf("%s %s /: the source of a bind over / must be a directory", op.Option, op.Args[0]))
				continue
			}
			entries, err := h.ReadDir(src)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s /: %w", op.Option, src, err))
				continue
			}
			for _, e := range entries {
				path := filepath.Join(src, e.Name())
				dst := "/" + e.Name()
				if coveredLater(ops[i+1:], dst, h.Cwd) {
					continue
				}
				if e.Type()&fs.ModeSymlink != 0 {
					link, err := h.Readlink(path)
					if err != nil {
						errs = append(errs, fmt.Errorf("%s: readlink %s: %w", op.Option, path, err))
						continue
					}
					ms = append(ms, nsinit.Mount{Kind: nsinit.MountSymlink, Source: link, Target: dst})
					links[dst] = link
					continue
				}
				if !e.IsDir() && !e.Type().IsRegular() {
					continue // sockets, fifos, devices at the top of / are not bound
				}
				ms = append(ms, nsinit.Mount{Kind: nsinit.MountBind, Source: path, Target: dst, ReadOnly: ro, Devices: devices})
			}
		case "--overlay-src":
			lowers = append(lowers, hostPath(op.Args[0], h.Cwd))
		case "--overlay", "--tmp-overlay", "--ro-overlay":
			// An overlay of the --overlay-src before it (parse checked
			// their number), the last given on top (bubblewrap's order):
			// the launcher makes it on the host, detached, and the init
			// attaches it as a bind's tree. Every layer is a host path
			// found like a bind source; --overlay's upper and work dirs
			// too (the writes land in its upper dir on the host),
			// --tmp-overlay's are a tmpfs of the launcher's, gone with the
			// sandbox; --ro-overlay has none.
			m := nsinit.Mount{Kind: nsinit.MountBind, Target: dest(op.Args[len(op.Args)-1]), ReadOnly: op.Option == "--ro-overlay"}
			o := &nsinit.Overlay{Lower: slices.Clone(lowers)}
			slices.Reverse(o.Lower)
			m.Overlay, m.Source, lowers = o, o.Lower[0], nil
			layers := slices.Clone(o.Lower)
			if op.Option == "--overlay" {
				o.Upper, o.Work = hostPath(op.Args[0], h.Cwd), hostPath(op.Args[1], h.Cwd)
				layers = append(layers, o.Upper, o.Work)
			}
			ok := true
			for _, p := range layers {
				if _, err := h.Stat(p); err != nil {
					var pe *fs.PathError
					if errors.As(err, &pe) {
						err = pe.Err
					}
					errs = append(errs, &SourceError{Option: op.Option, Path: p, Err: err})
					ok = false
				}
			}
			if ok {
				ms = append(ms, m)
			}
		case "--tmpfs":
			perms := 0o755
			if op.Perms >= 0 {
				perms = op.Perms
			}
			data := fmt.Sprintf("mode=%#o", perms)
			if op.Size > 0 {
				data += fmt.Sprintf(",size=%d", op.Size)
			}
			data += owner
			ms = append(ms, nsinit.Mount{Kind: nsinit.MountTmpfs, Target: dest(op.Args[0]), Data: data})
		case "--mqueue":
			ms = append(ms, nsinit.Mount{Kind: nsinit.MountMqueue, Target: dest(op.Args[0])})
		case "--proc":
			ms = append(ms, nsinit.Mount{Kind: nsinit.MountProc, Target: dest(op.Args[0])})
		case "--dev":
			ms = append(ms, devMounts(dest(op.Args[0]), owner)...)
		case "--dir":
			dst := dest(op.Args[0])
			switch {
			case op.Perms < 0:
				ms = append(ms, nsinit.Mount{Kind: nsinit.MountDir, Target: dst, Mode: 0o755})
			case op.Perms == 0:
				// Mode 0 is the init's default (0755): made 0700 (its
				// parents' mode, as bubblewrap's), then chmod 0.
				ms = append(ms, nsinit.Mount{Kind: nsinit.MountDir, Target: dst, Mode: 0o700},
					nsinit.Mount{Kind: nsinit.MountChmod, Target: dst, Mode: 0})
			default:
				ms = append(ms, nsinit.Mount{Kind: nsinit.MountDir, Target: dst, Mode: uint32(op.Perms)})
			}
		case "--symlink":
			dst := dest(op.Args[1])
			ms = append(ms, nsinit.Mount{Kind: nsinit.MountSymlink, Source: op.Args[0], Target: dst})
			links[dst] = op.Args[0]
		case "--remount-ro":
			ms = append(ms, nsinit.Mount{Kind: nsinit.MountRemountRO, Target: dest(op.Args[0])})
		case "--chmod":
			ms = append(ms, nsinit.Mount{Kind: nsinit.MountChmod, Target: dest(op.Args[1]), Mode: uint32(op.Numbers[0])})
		case "--file", "--bind-data", "--ro-bind-data":
			// --file: a file in the sandbox's filesystem, 0666 by
			// default; --bind-data and --ro-bind-data: bubblewrap binds a
			// deleted temporary file, 0600 by default, here the init's
			// file (read-only bound onto itself for --ro-bind-data). The
			// init sets the mode exactly (no umask).
			data, err := h.ReadFD(op.FD())
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %d %s: Can't read from fd %d: %w", op.Option, op.FD(), op.Args[1], op.FD(), err))
				continue
			}
			perms := uint32(0o600)
			if op.Option == "--file" {
				perms = 0o666
			}
			if op.Perms >= 0 {
				perms = uint32(op.Perms)
			}
			if perms == 0 {
				errs = append(errs, &Unsupported{Option: "--perms", Why: fmt.Sprintf("mode 0 for %s %s: the init reads mode 0 as its default", op.Option, op.Args[1])})
				continue
			}
			ms = append(ms, nsinit.Mount{Kind: nsinit.MountFile, Target: dest(op.Args[1]), Contents: string(data), Mode: perms, ReadOnly: op.Option == "--ro-bind-data"})
		}
	}
	return ms, errors.Join(errs...)
}

// devMounts is bubblewrap's --dev in the init's steps: a tmpfs with the
// usual device nodes bound from the host, a private devpts, the ptmx,
// fd, std* and core symlinks, and an shm directory.
func devMounts(dst, owner string) []nsinit.Mount {
	ms := []nsinit.Mount{{Kind: nsinit.MountTmpfs, Target: dst, Data: "mode=0755" + owner}}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		ms = append(ms, nsinit.Mount{Kind: nsinit.MountDevNode, Source: "/dev/" + d, Target: filepath.Join(dst, d)})
	}
	links := [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}, {"/proc/kcore", "core"}}
	for _, l := range links {
		ms = append(ms, nsinit.Mount{Kind: nsinit.MountSymlink, Source: l[0], Target: filepath.Join(dst, l[1])})
	}
	ms = append(ms,
		nsinit.Mount{Kind: nsinit.MountDir, Target: filepath.Join(dst, "shm"), Mode: 0o755},
		nsinit.Mount{Kind: nsinit.MountDevpts, Target: filepath.Join(dst, "pts"), Data: "newinstance,ptmxmode=0666,mode=620"},
		nsinit.Mount{Kind: nsinit.MountSymlink, Source: "pts/ptmx", Target: filepath.Join(dst, "ptmx")},
	)
	return ms
}

// resolveLinks follows, in an absolute clean path inside the sandbox, the
// symlinks the line made (links: where each is, and what it says), as
// the kernel would inside the new root (at most 40).
func resolveLinks(p string, links map[string]string) string {
	for n := 0; n < 40; n++ {
		changed := false
		for dir := p; dir != "/"; dir = filepath.Dir(dir) {
			target, ok := links[dir]
			if !ok {
				continue
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(dir), target)
			}
			p = filepath.Clean(target + "/" + strings.TrimPrefix(p, dir))
			changed = true
			break
		}
		if !changed {
			return p
		}
	}
	return p
}

// coveredLater reports whether a later op mounts exactly at dst.
func coveredLater(ops []Op, dst, cwd string) bool {
	for _, op := range ops {
		switch op.Option {
		case "--tmpfs", "--proc", "--dev":
			if insidePath(op.Args[0]) == dst {
				return true
			}
		case "--bind", "--ro-bind", "--dev-bind":
			if insidePath(op.Args[1]) == dst {
				return true
			}
		}
	}
	return false
}

// visibleDir reports whether path inside the sandbox is a directory some
// bind provides (a later tmpfs, proc or dev over it hides it).
func visibleDir(ms []nsinit.Mount, path string, h Host) bool {
	ok := false
	for _, m := range ms {
		if !under(path, m.Target) || m.Kind == nsinit.MountChmod || m.Kind == nsinit.MountRemountRO {
			continue
		}
		switch m.Kind {
		case nsinit.MountBind:
			ok = searchable(m, strings.TrimPrefix(path, m.Target), h)
		case nsinit.MountDir:
			ok = path == m.Target
		default:
			ok = path == m.Target && m.Kind != nsinit.MountSymlink && m.Kind != nsinit.MountFile
		}
	}
	return ok
}

// searchable reports whether the tool may enter rel below a bind's
// source: every directory from the source down must let it search. The
// tool is the caller rootless; root mode, through a bind mapped to its
// owner the source's owner, through every other root (Sandbox.MapRoot),
// without a capability. (The init's chdir is a hard failure, so the
// fallback must not pick a directory the tool cannot enter, as
// bubblewrap's fallback skips one.)
func searchable(m nsinit.Mount, rel string, h Host) bool {
	dir := m.Source
	comps := append([]string{""}, strings.Split(strings.Trim(rel, "/"), "/")...)
	for i, c := range comps {
		if i > 0 && c == "" {
			continue
		}
		dir = filepath.Join(dir, c)
		fi, err := h.Stat(dir)
		if err != nil || !fi.IsDir() {
			return false
		}
		st, known := fi.Sys().(*syscall.Stat_t)
		if !known {
			continue // a test's description: no owner to check
		}
		uid, gid := h.UID, h.GID
		if h.Root && m.IDMapOwner {
			uid, gid = int(st.Uid), int(st.Gid)
		}
		var bit uint32 = 0o001
		switch {
		case int(st.Uid) == uid:
			bit = 0o100
		case int(st.Gid) == gid:
			bit = 0o010
		}
		if st.Mode&bit == 0 {
			return false
		}
	}
	return true
}

// SecretDirs are the directories a bind may show that str always hides
// (Kubernetes service-account tokens, Docker and Compose secrets).
var SecretDirs = []string{"/var/run/secrets", "/run/secrets"}

// boundDir reports whether path is a real directory inside, reached
// through a bind without a symlink on the way (the init mounts over it by
// a symlink-free walk; a path through a symlink is the other entry of
// SecretDirs, or nothing).
func boundDir(ms []nsinit.Mount, path string, h Host) bool {
	var src, top string // the host path behind path, under the last mount over it
	for _, m := range ms {
		if under(path, m.Target) && m.Kind != nsinit.MountChmod && m.Kind != nsinit.MountRemountRO {
			src, top = "", ""
			if m.Kind == nsinit.MountBind {
				src, top = filepath.Join(m.Source, strings.TrimPrefix(path, m.Target)), m.Source
			}
		}
	}
	if src == "" {
		return false
	}
	for p := src; len(p) > len(top); p = filepath.Dir(p) {
		fi, err := h.Lstat(p)
		if err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

// hostFileOf returns the host path behind path inside, when the last
// mount over it is a bind.
func hostFileOf(ms []nsinit.Mount, path string) (string, bool) {
	host := ""
	for _, m := range ms {
		if !under(path, m.Target) || m.Kind == nsinit.MountChmod || m.Kind == nsinit.MountRemountRO {
			continue
		}
		host = ""
		if m.Kind == nsinit.MountBind && m.Overlay == nil { // an overlay's files are no one host file
			host = filepath.Join(m.Source, strings.TrimPrefix(path, m.Target))
		}
	}
	return host, host != ""
}

// rootOwned reports whether fi's owner is root, uid or gid (false when
// unknown: a test's description of a file).
func rootOwned(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && (st.Uid == 0 || st.Gid == 0)
}

func under(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

// insidePath is a destination as bubblewrap reads it: relative to the
// sandbox's root.
func insidePath(p string) string { return filepath.Clean("/" + p) }

// hostPath is a bind source as bubblewrap reads it: relative to the
// caller's working directory.
func hostPath(p, cwd string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(cwd, p)
}

// clearEnv is --clearenv: everything goes but PWD (bubblewrap keeps it).
func clearEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "PWD=") {
			out = append(out, kv)
		}
	}
	return out
}

// setEnv sets one variable (last); the order of the others is kept.
func setEnv(env []string, k, v string) []string {
	return append(unsetEnv(env, k), k+"="+v)
}

// unsetEnv removes one variable.
func unsetEnv(env []string, k string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, k+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func getEnv(env []string, k string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, k+"="); ok {
			return v
		}
	}
	return ""
}

// HonouredOptions lists the options str honours, sorted.
func HonouredOptions() []string {
	var out []string
	for _, n := range Options() {
		if _, ok := refused[n]; !ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
