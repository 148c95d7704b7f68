package writeback

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// Report is what step L10 copied back for a capped `str run --workdir`.
type Report struct {
	Dir      string   `json:"dir"`
	Files    int      `json:"files"`    // regular files written
	Dirs     int      `json:"dirs"`     // directories made
	Symlinks int      `json:"symlinks"` // symlinks written
	Removed  int      `json:"removed"`  // names the tool removed
	Bytes    int64    `json:"bytes"`    // bytes of file content written
	Skipped  []string `json:"skipped,omitempty"`
	// Error is the first failure; the copy goes on with the other entries.
	Error *nsinit.StepError `json:"error,omitempty"`
}

// Dir is one capped work dir's state between L3 and L10: made by Overlay,
// ended by CopyBack or, for a sandbox that never ran, Close.
type Dir struct {
	dir      string
	dirFD    int // O_PATH of DIR, the clone's root
	upperFS  int // the detached tmpfs holding upper/ and work/
	uid, gid int // the identity the copy writes with
}

// overlayNames are the upper layer's and overlay work dir's names in the
// detached tmpfs.
const (
	upperName = "upper"
	ovlWork   = "work"
)

// Overlay (part of L3) turns tree, the detached clone of m.Source, into a
// detached overlay capped by wd. It returns the overlay's descriptor
// (which replaces tree: the overlay holds its own reference to the lower
// layer) and the state L10 needs. toolUID/GID are the tool's leased host
// ids.
func Overlay(tree int, m nsinit.Mount, wd profiles.WorkDir, toolUID, toolGID int) (int, *Dir, error) {
	se := func(action, detail string, err error) *nsinit.StepError {
		return &nsinit.StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: action, Path: m.Source, Detail: detail, Msg: err.Error(), Err: err}
	}
	// DIR itself, by the one descriptor L10 writes through: the same
	// directory as the clone's root, or the path changed in between.
	dirFD, err := unix.Open(m.Source, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, se("open work dir", "O_PATH|O_DIRECTORY|O_NOFOLLOW", err)
	}
	var dst, tst unix.Stat_t
	if err := unix.Fstat(dirFD, &dst); err != nil {
		unix.Close(dirFD)
		return -1, nil, se("open work dir", "fstat", err)
	}
	if err := unix.Fstat(tree, &tst); err != nil {
		unix.Close(dirFD)
		return -1, nil, se("open work dir", "fstat clone", err)
	}
	if dst.Dev != tst.Dev || dst.Ino != tst.Ino {
		unix.Close(dirFD)
		return -1, nil, se("open work dir", fmt.Sprintf("clone %d:%d, path %d:%d", tst.Dev, tst.Ino, dst.Dev, dst.Ino),
			errors.New("the work dir was replaced while it was being bound"))
	}
	wb := &Dir{dir: m.Source, dirFD: dirFD, upperFS: -1, uid: toolUID, gid: toolGID}
	if m.IDMapOwner {
		wb.uid, wb.gid = int(dst.Uid), int(dst.Gid)
	}
	fail := func(err error) (int, *Dir, error) {
		wb.Close()
		return -1, nil, err
	}
	// The capped tmpfs, detached: no host path ever shows it.
	params := [][2]string{{"size", strconv.FormatInt(int64(wd.Size), 10)}, {"nr_inodes", strconv.FormatInt(wd.Inodes, 10)}, {"mode", "0700"}}
	upperFS, err := mountDetached("tmpfs", params)
	if err != nil {
		return fail(se("mount work dir cap", "tmpfs "+paramString(params), err))
	}
	wb.upperFS = upperFS
	// upper/ is the overlay's root as the tool sees it: DIR's mode, and
	// DIR's owner as the lower layer shows it to the tool.
	owner, group := int(dst.Uid), int(dst.Gid)
	if m.IDMapOwner {
		owner, group = toolUID, toolGID
	}
	if err := unix.Mkdirat(upperFS, upperName, 0o700); err != nil {
		return fail(se("mount work dir cap", "mkdir "+upperName, err))
	}
	if err := unix.Fchownat(upperFS, upperName, owner, group, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail(se("mount work dir cap", "chown "+upperName, err))
	}
	if err := unix.Fchmodat(upperFS, upperName, dst.Mode&0o7777, 0); err != nil {
		return fail(se("mount work dir cap", "chmod "+upperName, err))
	}
	if err := unix.Mkdirat(upperFS, ovlWork, 0o700); err != nil {
		return fail(se("mount work dir cap", "mkdir "+ovlWork, err))
	}
	// The overlay. Its layers are named through this process's
	// descriptors: the lower layer is the clone (not DIR's path again).
	ovl, err := mountDetached("overlay", [][2]string{
		{"lowerdir", fdPath(tree)},
		{"upperdir", fdPath(upperFS) + "/" + upperName},
		{"workdir", fdPath(upperFS) + "/" + ovlWork},
		{"redirect_dir", "off"}, {"index", "off"}, {"metacopy", "off"},
	})
	if err != nil {
		e := se("mount work dir cap", "overlay lowerdir=clone,upperdir=tmpfs", err)
		e.Hint = "the kernel refused an overlay on this work dir; pass --workdir-live for an uncapped live bind"
		return fail(e)
	}
	return ovl, wb, nil
}

// mountDetached creates a filesystem with the new mount API and returns
// its detached mount (nosuid,nodev). A parameter with an empty value is
// a flag.
func mountDetached(fstype string, params [][2]string) (int, error) {
	fsfd, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fsfd)
	for _, p := range params {
		set := func() error { return unix.FsconfigSetString(fsfd, p[0], p[1]) }
		if p[1] == "" { // a flag (userxattr)
			set = func() error { return unix.FsconfigSetFlag(fsfd, p[0]) }
		}
		if err := set(); err != nil {
			return -1, fmt.Errorf("fsconfig %s=%s: %w", p[0], p[1], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("fsconfig create %s: %w", fstype, err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	return mfd, nil
}

// paramString is params as a mount's option string ("size=1,mode=0700").
func paramString(params [][2]string) string {
	var b strings.Builder
	for i, p := range params {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p[0] + "=" + p[1])
	}
	return b.String()
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// Close lets go of the work dir and the capped tmpfs (with what the tool
// wrote: nothing is copied).
func (wb *Dir) Close() {
	if wb.dirFD >= 0 {
		unix.Close(wb.dirFD)
		wb.dirFD = -1
	}
	if wb.upperFS >= 0 {
		unix.Close(wb.upperFS)
		wb.upperFS = -1
	}
}

// CopyBack is step L10: call it once every process of the sandbox is
// gone. It runs on a thread of its own, whose identity it changes and
// which the runtime discards afterwards (the goroutine ends locked).
func (wb *Dir) CopyBack() *Report {
	out := make(chan *Report)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its changed identity
		r := &Report{Dir: wb.dir}
		c := &copier{r: r}
		if err := c.become(wb.uid, wb.gid); err != nil {
			c.fail("set the copy's identity", "", fmt.Sprintf("uid %d gid %d", wb.uid, wb.gid), err)
		} else {
			c.copyDir(wb.upperFS, upperName, wb.dirFD, "")
		}
		out <- r
	}()
	r := <-out
	wb.Close()
	return r
}

// copier walks the upper layer (step L10.3) with the thread's identity
// switched between root (reading) and the copy's (writing).
type copier struct {
	r        *Report
	uid, gid int
}

// become sets the thread's groups, fsgid and fsuid (raw syscalls: the
// thread's own credentials, not the process's).
func (c *copier) become(uid, gid int) error {
	c.uid, c.gid = uid, gid
	g := uint32(gid)
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 1, uintptr(unsafe.Pointer(&g)), 0); e != 0 {
		return fmt.Errorf("setgroups [%d]: %w", gid, e)
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(gid), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
	// setfs[ug]id returns the previous id whatever happens: read back.
	if got, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); int(got) != uid {
		return fmt.Errorf("setfsuid %d: still %d", uid, got)
	}
	if got, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0); int(got) != gid {
		return fmt.Errorf("setfsgid %d: still %d", gid, got)
	}
	return nil
}

// asRoot runs f with fsuid 0 (the capabilities that go with it come
// back), then the copy's identity again.
func (c *copier) asRoot(f func() error) error {
	unix.RawSyscall(unix.SYS_SETFSUID, 0, 0, 0)
	err := f()
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(c.uid), 0, 0)
	return err
}

func (c *copier) fail(action, rel, detail string, err error) {
	if c.r.Error != nil {
		return
	}
	path := c.r.Dir
	if rel != "" {
		path += "/" + rel
	}
	c.r.Error = &nsinit.StepError{Who: "launcher", Step: nsinit.StepLWriteBack, Action: action, Path: path, Detail: detail, Msg: err.Error(), Err: err}
}

// beneath is how every path below DIR is resolved.
var beneath = unix.OpenHow{Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}

func openBeneath(dir int, name string, flags int, mode uint32) (int, error) {
	how := beneath
	how.Flags = uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW)
	how.Mode = uint64(mode)
	return unix.Openat2(dir, name, &how)
}

// copyDir copies the upper directory name (in upperParent) into the DIR
// directory dst (rel is its path below DIR, for messages).
func (c *copier) copyDir(upperParent int, name string, dst int, rel string) {
	var src int
	err := c.asRoot(func() (err error) {
		src, err = unix.Openat(upperParent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		c.fail("read the tool's changes", rel, "open "+name, err)
		return
	}
	f := os.NewFile(uintptr(src), name)
	defer f.Close()
	var names []string
	err = c.asRoot(func() (err error) {
		names, err = f.Readdirnames(-1)
		return err
	})
	if err != nil {
		c.fail("read the tool's changes", rel, "readdir", err)
		return
	}
	for _, n := range names {
		c.copyEntry(src, n, dst, join(rel, n))
	}
}

func join(rel, n string) string {
	if rel == "" {
		return n
	}
	return rel + "/" + n
}

// copyEntry is L10.3 for one upper entry.
func (c *copier) copyEntry(src int, name string, dst int, rel string) {
	var st unix.Stat_t
	if err := c.asRoot(func() error { return unix.Fstatat(src, name, &st, unix.AT_SYMLINK_NOFOLLOW) }); err != nil {
		c.fail("read the tool's changes", rel, "lstat", err)
		return
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			c.r.Skipped = append(c.r.Skipped, rel)
			return
		}
		// A whiteout: the tool removed the name.
		if err := removeBeneath(dst, name); err != nil && !errors.Is(err, unix.ENOENT) {
			c.fail("remove", rel, "a name the tool removed", err)
			return
		}
		c.r.Removed++
	case unix.S_IFDIR:
		c.copySubdir(src, name, dst, rel, &st)
	case unix.S_IFREG, unix.S_IFLNK:
		c.copyFile(src, name, dst, rel, &st)
	default:
		c.r.Skipped = append(c.r.Skipped, rel)
	}
}

func (c *copier) copySubdir(src int, name string, dst int, rel string, st *unix.Stat_t) {
	// Opaque: the tool removed the directory and made it again, so
	// nothing of DIR's copy stays.
	opaque := false
	_ = c.asRoot(func() error {
		buf := make([]byte, 1)
		n, err := unix.Lgetxattr(fdPath(src)+"/"+name, "trusted.overlay.opaque", buf)
		opaque = err == nil && n == 1 && buf[0] == 'y'
		return nil
	})
	var dt unix.Stat_t
	err := unix.Fstatat(dst, name, &dt, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && dt.Mode&unix.S_IFMT != unix.S_IFDIR, err == nil && opaque:
		if err := removeBeneath(dst, name); err != nil {
			c.fail("remove", rel, "to make a directory", err)
			return
		}
		err = unix.ENOENT
	}
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(dst, name, 0o700); err != nil {
			c.fail("make directory", rel, "", err)
			return
		}
		c.r.Dirs++
	} else if err != nil {
		c.fail("make directory", rel, "lstat", err)
		return
	}
	d, err := openBeneath(dst, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		c.fail("make directory", rel, "openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS", err)
		return
	}
	defer unix.Close(d)
	c.copyDir(src, name, d, rel)
	// Mode and time last: a 0555 directory is still filled first.
	if err := unix.Fchmod(d, st.Mode&0o1777); err != nil {
		c.fail("set mode", rel, fmt.Sprintf("%#o", st.Mode&0o1777), err)
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	_ = unix.UtimesNanoAt(d, "", ts, unix.AT_EMPTY_PATH)
}

func (c *copier) copyFile(src int, name string, dst int, rel string, st *unix.Stat_t) {
	tmp := tempName()
	var err error
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		var target string
		if err = c.asRoot(func() (err error) { target, err = readlinkat(src, name); return err }); err != nil {
			c.fail("read the tool's changes", rel, "readlink", err)
			return
		}
		if err = unix.Symlinkat(target, dst, tmp); err != nil {
			c.fail("write symlink", rel, "", err)
			return
		}
		c.r.Symlinks++
	} else {
		var in int
		if err = c.asRoot(func() (err error) {
			in, err = unix.Openat(src, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			return err
		}); err != nil {
			c.fail("read the tool's changes", rel, "open", err)
			return
		}
		src := os.NewFile(uintptr(in), name)
		n, werr := c.writeFile(src, dst, tmp, st)
		src.Close()
		if werr != nil {
			_ = unix.Unlinkat(dst, tmp, 0)
			c.fail("write file", rel, fmt.Sprintf("%d bytes", st.Size), werr)
			return
		}
		c.r.Files++
		c.r.Bytes += n
	}
	// The rename replaces a file or symlink of that name; a directory
	// there (the tool removed it and made a file) goes first.
	var dt unix.Stat_t
	if unix.Fstatat(dst, name, &dt, unix.AT_SYMLINK_NOFOLLOW) == nil && dt.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := removeBeneath(dst, name); err != nil {
			_ = unix.Unlinkat(dst, tmp, 0)
			c.fail("remove", rel, "a directory the tool replaced", err)
			return
		}
	}
	if err := unix.Renameat(dst, tmp, dst, name); err != nil {
		_ = unix.Unlinkat(dst, tmp, 0)
		c.fail("write file", rel, "rename", err)
	}
}

// writeFile copies in into a new file tmp of dst with st's permission
// bits (no setuid, setgid or sticky bit) and modification time.
func (c *copier) writeFile(in *os.File, dst int, tmp string, st *unix.Stat_t) (int64, error) {
	out, err := openBeneath(dst, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(out), tmp)
	defer f.Close()
	n, err := io.Copy(f, in)
	if err != nil {
		return n, err
	}
	if err := f.Chmod(os.FileMode(st.Mode & 0o777)); err != nil {
		return n, err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(out, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return n, err
	}
	return n, f.Close()
}

// removeBeneath removes name in dir, a directory with everything below
// it, never following a symlink.
func removeBeneath(dir int, name string) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || !(errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM)) {
		return err
	}
	d, err := openBeneath(dir, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(d), name)
	names, err := f.Readdirnames(-1)
	if err != nil {
		f.Close()
		return err
	}
	for _, n := range names {
		if err := removeBeneath(d, n); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
}

func readlinkat(dir int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dir, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// tempName is a fresh name beside a target: never one the tool chose.
func tempName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return ".str-writeback-" + hex.EncodeToString(b[:])
}
