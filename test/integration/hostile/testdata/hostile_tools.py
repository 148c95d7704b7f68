"""Hostile tools of the battery (test/integration/hostile). attack(ctx,
case, **kw) runs one attempt, named by the Go table's py name, and returns
{"outcome": ...}: an errno name ("EPERM"), "ok" when the attempt worked,
or a case-specific word. The Go side asserts the exact outcome."""

import ctypes
import errno
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# x86_64 syscall numbers
SYS = {
    "getpid": 39, "clone": 56, "ptrace": 101, "setuid": 105, "ioctl": 16, "personality": 135,
    "pivot_root": 155, "chroot": 161, "mount": 165, "sethostname": 170, "init_module": 175,
    "kexec_load": 246, "add_key": 248, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310, "finit_module": 313,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "clone3": 435,
}
X32_BIT = 0x40000000
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x20000, 0x10000000, 0x40000000, 0x20000000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C


def en(e):
    """The errno name of an OSError."""
    return errno.errorcode.get(getattr(e, "errno", None) or 0, type(e).__name__)


def sysc(name, *args):
    """A raw syscall: "ok" or the errno name."""
    r = libc.syscall(ctypes.c_long(SYS[name] if isinstance(name, str) else name),
                     *[ctypes.c_ulong(a) if isinstance(a, int) else a for a in args])
    if r < 0:
        return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    return "ok"


def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return en(e)


def in_child(fn):
    """Runs fn in a forked child; "exit:N" or "signal:NAME"."""
    pid = os.fork()
    if pid == 0:
        try:
            code = fn()
        except BaseException:
            code = 99
        os._exit(code or 0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "signal:" + signal.Signals(os.WTERMSIG(status)).name
    return "exit:%d" % os.WEXITSTATUS(status)


def read(path, n=4096):
    with open(path, "rb") as f:
        return f.read(n)


def write(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)


def fill(path, chunk=1 << 20, limit=1 << 40):
    """Writes path until an error; (errno name, bytes written)."""
    n = 0
    buf = b"\x01" * chunk
    try:
        with open(path, "wb", buffering=0) as f:
            while n < limit:
                n += f.write(buf)
    except OSError as e:
        return en(e), n
    return "ok", n


def daemon(marker):
    """Double-forks a process that sleeps, with marker on its command
    line (sleep reads "600.<marker>" as seconds)."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "600." + marker])
        os._exit(0)
    os.wait()


def connect(host, port):
    try:
        s = socket.create_connection((host, int(port)), timeout=3)
        s.close()
        return "connected"
    except OSError as e:
        return en(e) if e.errno else type(e).__name__


def via_proxy(target):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=3)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        line = s.recv(200).decode(errors="replace").split("\r\n")[0]
        s.close()
        return line.split(" ")[1] if line.startswith("HTTP/") else line
    except OSError as e:
        return en(e)


# ---------------------------------------------------------------- cases


def c_read_shadow(ctx, kw):
    return {"outcome": attempt(lambda: read("/etc/shadow"))}


def c_read_host_path(ctx, kw):
    return {"outcome": attempt(lambda: read(kw["path"]))}


def c_write_tools_dir(ctx, kw):
    here = os.path.dirname(os.path.abspath(__file__))
    return {"outcome": attempt(lambda: write(os.path.join(here, "pwned.py"))), "dir": here}


def c_write_path(ctx, kw):
    return {"outcome": attempt(lambda: write(kw["path"]))}


def c_output_symlink(ctx, kw):
    out = ctx._output_dir
    ctx.save_artifact_text("ok.txt", "fine")
    os.symlink("/etc/passwd", os.path.join(out, "passwd.txt"))
    os.symlink(kw["host_file"], os.path.join(out, "host.txt"))
    os.symlink("/", os.path.join(out, "root"))
    return {"outcome": "planted"}


def c_output_hardlink(ctx, kw):
    out = ctx._output_dir
    ctx.save_artifact_text("ok.txt", "fine")
    r = {}
    r["usr"] = attempt(lambda: os.link("/usr/bin/python3", os.path.join(out, "python3")))
    inp = ctx.list_artifacts()["secret"]
    r["input"] = attempt(lambda: os.link(inp, os.path.join(out, "input.txt")))
    return {"outcome": "%s,%s" % (r["usr"], r["input"])}


def c_output_fifo(ctx, kw):
    out = ctx._output_dir
    ctx.save_artifact_text("ok.txt", "fine")
    return {"outcome": attempt(lambda: os.mkfifo(os.path.join(out, "fifo.txt")))}


def c_output_device(ctx, kw):
    out = ctx._output_dir
    ctx.save_artifact_text("ok.txt", "fine")
    r = [attempt(lambda: os.mknod(os.path.join(out, "null.txt"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))),
         attempt(lambda: os.mknod(os.path.join(out, "sda.txt"), 0o666 | stat.S_IFBLK, os.makedev(8, 0)))]
    return {"outcome": ",".join(r)}


def c_output_swap(ctx, kw):
    """Writes x.txt, then leaves a process that keeps swapping it for a
    symlink to a host file while the worker collects the outputs. Both
    are staged outside output/ and renamed over x.txt, so whenever the
    process dies output/ holds x.txt alone (a symlink or the original),
    never a staging name. The tool returns once a first swap worked, so
    the swapping is under way however fast the tool would end."""
    out = ctx._output_dir
    path = os.path.join(out, "x.txt")
    ctx.save_artifact_text("x.txt", "original")
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        os.close(r)
        link = os.path.join(os.getcwd(), ".lnk")  # outside output/
        keep = os.path.join(os.getcwd(), ".keep")  # outside output/
        os.link(path, keep)
        end = time.time() + 30
        while time.time() < end:
            try:
                os.symlink(kw["host_file"], link)
                os.rename(link, path)
                os.link(keep, link)
                os.rename(link, path)
                status = b"planted"
            except OSError as e:
                status = en(e).encode()
            if w >= 0:
                os.write(w, status)
                os.close(w)
                w = -1
        os._exit(0)
    os.close(w)
    return {"outcome": os.read(r, 64).decode() or "no swap"}


def c_output_many(ctx, kw):
    out = ctx._output_dir
    n = 0
    try:
        for n in range(int(kw.get("n", 100000))):
            os.close(os.open(os.path.join(out, "f%06d" % n), os.O_CREAT | os.O_WRONLY, 0o644))
        n += 1
    except OSError as e:
        return {"outcome": en(e), "files": n}
    return {"outcome": "ok", "files": n}


def c_fsize_efbig(ctx, kw):
    def big():
        with open("big.bin", "wb") as f:
            f.seek(int(kw["size"]))
            f.write(b"x")
    return {"outcome": attempt(big), "sigxfsz": str(signal.getsignal(signal.SIGXFSZ))}


def c_fsize_sigxfsz(ctx, kw):
    with open("big.bin", "wb") as f:
        p = subprocess.run(["/bin/sh", "-c", "exec head -c %d /dev/zero" % (int(kw["size"]) + 4096)], stdout=f)
    if p.returncode < 0:
        return {"outcome": "signal:" + signal.Signals(-p.returncode).name, "size": os.path.getsize("big.bin")}
    return {"outcome": "exit:%d" % p.returncode}


def c_fill(ctx, kw):
    code, n = fill(kw["path"])
    return {"outcome": code, "bytes": n}


def c_fill_inodes(ctx, kw):
    os.mkdir("many")
    n = 0
    try:
        while n < 200_000:
            os.close(os.open("many/%d" % n, os.O_CREAT | os.O_WRONLY, 0o644))
            n += 1
    except OSError as e:
        outcome = en(e)
    else:
        outcome = "ok"
    # Left full: the runner's result.json is on a tmpfs of its own
    # (launcher step L9), so the answer gets out all the same.
    return {"outcome": outcome, "files": n}


def c_other_workdir(ctx, kw):
    parent = os.path.dirname(os.getcwd())
    return {"outcome": attempt(lambda: os.listdir(kw["path"])),
            "siblings": sorted(os.listdir(parent)), "own": os.path.basename(os.getcwd())}


def c_proc_self_exe(ctx, kw):
    return {"outcome": attempt(lambda: open("/proc/self/exe", "r+b").close()),
            "exe": os.readlink("/proc/self/exe")}


def c_proc_1_exe(ctx, kw):
    return {"outcome": attempt(lambda: open("/proc/1/exe", "r+b").close()),
            "exe": os.readlink("/proc/1/exe"), "pid": os.getpid()}


def c_proc_1_root(ctx, kw):
    same = sorted(os.listdir("/proc/1/root/")) == sorted(os.listdir("/"))
    return {"outcome": attempt(lambda: read("/proc/1/root/etc/shadow")), "same_as_root": same,
            "escape": attempt(lambda: os.listdir("/proc/1/root/../../../root"))}


def c_proc_self_fd(ctx, kw):
    fds = {}
    d = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    for name in os.listdir(d):
        if int(name) == d:
            continue
        try:
            fds[name] = os.readlink("/proc/self/fd/" + name)
        except OSError as e:
            fds[name] = en(e)
    os.close(d)
    dirs = [t for t in fds.values() if t.startswith("/") and os.path.isdir(t)]
    return {"outcome": "dirs:%d" % len(dirs), "fds": fds}


def c_cwd_escape(ctx, kw):
    for _ in range(64):
        os.chdir("..")
    root = os.getcwd()
    fd = os.open("/proc/self/cwd", os.O_RDONLY | os.O_DIRECTORY)
    os.fchdir(fd)
    os.close(fd)
    for _ in range(64):
        os.chdir("..")
    return {"outcome": root + "," + os.getcwd(), "entries": sorted(os.listdir("."))}


def c_proc_write(ctx, kw):
    return {"outcome": ",".join(attempt(lambda p=p: write(p, b"h")) for p in
                                ("/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/proc/self/attr/current"))}


def c_proc_read(ctx, kw):
    return {"outcome": ",".join(attempt(lambda p=p: read(p, 16)) for p in ("/proc/kcore", "/proc/kmsg"))}


def c_sys(ctx, kw):
    return {"outcome": attempt(lambda: os.listdir("/sys"))}


def c_dev(ctx, kw):
    return {"outcome": " ".join(sorted(os.listdir("/dev"))),
            "mem": attempt(lambda: read("/dev/mem", 1)), "kmsg": attempt(lambda: read("/dev/kmsg", 1))}


def c_procs(ctx, kw):
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return {"outcome": " ".join(map(str, pids))}


def c_signal_host(ctx, kw):
    r = [attempt(lambda: os.kill(int(kw["pid"]), 0)), attempt(lambda: os.kill(int(kw["pid"]), signal.SIGKILL))]
    return {"outcome": ",".join(r)}


def c_ptrace(ctx, kw):
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    r = sysc("ptrace", 16, pid, 0, 0)  # PTRACE_ATTACH
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    r2 = sysc("ptrace", 0x4206, 1, 0, 0)  # PTRACE_SEIZE of PID 1 (itself)
    r3 = in_child(lambda: 0 if sysc("ptrace", 0, 0, 0, 0) == "ok" else 1)  # PTRACE_TRACEME
    return {"outcome": "%s,%s,%s" % (r, r2, r3)}


def c_process_vm_readv(ctx, kw):
    return {"outcome": sysc("process_vm_readv", 1, 0, 0, 0, 0, 0)}


def c_fork_bomb(ctx, kw):
    kids = []
    outcome = "ok"
    try:
        for _ in range(10000):
            pid = os.fork()
            if pid == 0:
                signal.pause()
                os._exit(0)
            kids.append(pid)
    except OSError as e:
        outcome = en(e)
    for k in kids:
        os.kill(k, signal.SIGKILL)
    for k in kids:
        os.waitpid(k, 0)
    return {"outcome": outcome, "forked": len(kids)}


def c_zombies(ctx, kw):
    n = 0
    outcome = "ok"
    try:
        for _ in range(10000):
            if os.fork() == 0:
                os._exit(0)
            n += 1
    except OSError as e:
        outcome = en(e)
    zombies = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if read("/proc/%s/stat" % p).split(b") ")[1][:1] == b"Z":
                    zombies += 1
            except (OSError, IndexError):
                pass
    return {"outcome": outcome, "forked": n, "zombies": zombies}


def c_daemon(ctx, kw):
    daemon(kw["marker"])
    return {"outcome": "left"}


def c_leave_traces(ctx, kw):
    daemon(kw["marker"])
    for p in ("/tmp/trace", "/dev/shm/trace", "trace"):
        write(p)
    return {"outcome": "left"}


def c_find_traces(ctx, kw):
    found = [p for p in ("/tmp/trace", "/dev/shm/trace", "trace") if os.path.exists(p)]
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if kw["marker"].encode() in read("/proc/%s/cmdline" % p):
                    found.append("pid " + p)
            except OSError:
                pass
    return {"outcome": "found:%d" % len(found), "found": found}


def c_setuid_binary(ctx, kw):
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([os.path.join(here, "suid-id"), "-u"], capture_output=True, text=True)
    st = os.stat(os.path.join(here, "suid-id"))
    return {"outcome": p.stdout.strip() or p.stderr.strip(), "mode": oct(st.st_mode), "owner": st.st_uid}


def c_setuid0(ctx, kw):
    return {"outcome": ",".join([attempt(lambda: os.setuid(0)), attempt(lambda: os.setgroups([0])),
                                 attempt(lambda: os.setresuid(0, 0, 0))])}


def status_fields(*names):
    out = {}
    for line in read("/proc/self/status", 1 << 16).decode().splitlines():
        k, _, v = line.partition(":")
        if k in names:
            out[k] = v.strip()
    return out


def c_caps(ctx, kw):
    f = status_fields("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
    return {"outcome": " ".join(f[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))}


def c_seccomp_nnp(ctx, kw):
    f = status_fields("Seccomp", "NoNewPrivs")
    return {"outcome": "seccomp=%s nnp=%s" % (f.get("Seccomp"), f.get("NoNewPrivs"))}


def c_syscall(ctx, kw):
    """A syscall by name with integer arguments (kw["args"])."""
    return {"outcome": sysc(kw["name"], *[int(a) for a in kw.get("args", [])])}


def c_unshare(ctx, kw):
    return {"outcome": ",".join(sysc("unshare", f) for f in (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID))}


def c_mount(ctx, kw):
    return {"outcome": ",".join([
        sysc("mount", ctypes.c_char_p(b"none"), ctypes.c_char_p(b"/tmp"), ctypes.c_char_p(b"tmpfs"), 0, 0),
        sysc("mount", ctypes.c_char_p(b"/usr"), ctypes.c_char_p(b"/tmp"), 0, 0x1000, 0),  # MS_BIND
        sysc(166, ctypes.c_char_p(b"/usr"), 2)])}  # umount2(MNT_DETACH)


def c_pivot_root(ctx, kw):
    return {"outcome": ",".join([sysc("pivot_root", ctypes.c_char_p(b"/tmp"), ctypes.c_char_p(b"/tmp")),
                                 sysc("chroot", ctypes.c_char_p(b"/tmp"))])}


def c_keyctl(ctx, kw):
    return {"outcome": ",".join([
        sysc("keyctl", 0, 0xfffffffd, 0, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
        sysc("add_key", ctypes.c_char_p(b"user"), ctypes.c_char_p(b"k"), ctypes.c_char_p(b"v"), 1, 0xfffffffd)])}


def c_bpf(ctx, kw):
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("IIII", attr, 0, 2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY
    return {"outcome": sysc("bpf", 0, attr, 128)}  # BPF_MAP_CREATE


def c_perf(ctx, kw):
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("IIQ", attr, 0, 1, 128, 0)  # PERF_TYPE_SOFTWARE, cpu clock
    return {"outcome": sysc("perf_event_open", attr, 0, 0xffffffff, 0xffffffff, 0)}


def c_userfaultfd(ctx, kw):
    return {"outcome": ",".join([sysc("userfaultfd", os.O_CLOEXEC),
                                 attempt(lambda: os.close(os.open("/dev/userfaultfd", os.O_RDWR)))])}


def c_io_uring(ctx, kw):
    params = ctypes.create_string_buffer(120)
    return {"outcome": sysc("io_uring_setup", 8, params)}


def c_modules(ctx, kw):
    img = ctypes.create_string_buffer(64)
    fd = os.open("/dev/null", os.O_RDONLY)
    r = [sysc("init_module", img, 64, ctypes.c_char_p(b"")), sysc("finit_module", fd, ctypes.c_char_p(b""), 0),
         sysc("kexec_load", 0, 0, 0, 0)]
    os.close(fd)
    return {"outcome": ",".join(r)}


def c_ioctl_tty(ctx, kw):
    ch = ctypes.c_char(b"x")
    r = []
    for cmd in (TIOCSTI, TIOCSTI | (1 << 32), TIOCLINUX, TIOCLINUX | (1 << 32), TIOCSTI | (0xdead << 32)):
        r.append(sysc("ioctl", 0, cmd, ctypes.addressof(ch)))
    return {"outcome": ",".join(r), "tty": os.isatty(0)}


def c_personality(ctx, kw):
    r = [sysc("personality", 0x0400000),  # READ_IMPLIES_EXEC
         sysc("personality", 0x0040000),  # ADDR_NO_RANDOMIZE
         sysc("personality", 0x0100000),  # MMAP_PAGE_ZERO
         sysc("personality", 0x0040000 | (1 << 32))]  # high bits set
    return {"outcome": ",".join(r)}


def _clone3(flags):
    args = ctypes.create_string_buffer(88)
    struct.pack_into("QQQQQ", args, 0, flags, 0, 0, 0, signal.SIGCHLD)
    r = libc.syscall(ctypes.c_long(SYS["clone3"]), args, ctypes.c_ulong(88))
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
        return "ok"
    return errno.errorcode[ctypes.get_errno()]


def _clone(flags):
    r = libc.syscall(ctypes.c_long(SYS["clone"]), ctypes.c_ulong(flags | signal.SIGCHLD), ctypes.c_ulong(0),
                     ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
        return "ok"
    return errno.errorcode[ctypes.get_errno()]


def c_clone_ns(ctx, kw):
    return {"outcome": ",".join([_clone3(CLONE_NEWUSER), _clone3(CLONE_NEWNS | CLONE_NEWNET), _clone(CLONE_NEWUSER),
                                 _clone(CLONE_NEWNET), _clone(0)])}


def c_x32(ctx, kw):
    return {"outcome": in_child(lambda: libc.syscall(ctypes.c_long(X32_BIT | 39)) and 0)}


def c_int80(ctx, kw):
    import mmap

    def run():
        code = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"  # mov eax, 20 (i386 getpid); int 0x80; ret
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        m.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
        return 0
    return {"outcome": in_child(run)}


def c_open_by_handle(ctx, kw):
    h = ctypes.create_string_buffer(struct.pack("II", 8, 1) + b"\x02" + b"\x00" * 7)
    return {"outcome": sysc("open_by_handle_at", 0xffffff9c, h, 0)}  # AT_FDCWD


def c_setns(ctx, kw):
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    r = sysc("setns", fd, 0)
    os.close(fd)
    return {"outcome": ",".join([r, sysc("sethostname", ctypes.c_char_p(b"evil"), 4)])}


def c_socket_families(ctx, kw):
    r = []
    for fam, typ, proto in ((socket.AF_NETLINK, socket.SOCK_RAW, 9),  # NETLINK_AUDIT
                            (socket.AF_NETLINK, socket.SOCK_RAW, 15),  # NETLINK_KOBJECT_UEVENT
                            (socket.AF_PACKET, socket.SOCK_RAW, 0),
                            (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW),
                            (40, socket.SOCK_STREAM, 0),  # AF_VSOCK
                            (38, socket.SOCK_SEQPACKET, 0)):  # AF_ALG
        try:
            socket.socket(fam, typ, proto).close()
            r.append("ok")
        except OSError as e:
            r.append(en(e))
    return {"outcome": ",".join(r)}


def c_connect(ctx, kw):
    return {"outcome": connect(kw["host"], kw["port"])}


def c_proxy(ctx, kw):
    return {"outcome": via_proxy(kw["target"])}


def c_abstract(ctx, kw):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("\0" + kw["name"])
        return {"outcome": "connected"}
    except OSError as e:
        return {"outcome": en(e)}
    finally:
        s.close()


def c_dns(ctx, kw):
    try:
        infos = socket.getaddrinfo(kw["name"], 443, socket.AF_INET, socket.SOCK_STREAM)
        return {"outcome": "resolved", "addrs": sorted({i[4][0] for i in infos})}
    except socket.gaierror as e:
        return {"outcome": "gaierror:%d" % e.errno}


def c_interfaces(ctx, kw):
    return {"outcome": " ".join(n for _, n in socket.if_nameindex())}


def c_memory_hog(ctx, kw):
    # tmpfs pages are charged to the sandbox's memory cgroup: fill /tmp
    # and /dev/shm, then touch memory up to the address-space limit.
    fill("/tmp/hog")
    fill("/dev/shm/hog")
    hold = []
    try:
        while True:
            hold.append(b"\x01" * (8 << 20))
    except MemoryError:
        return {"outcome": "MemoryError", "held_mib": len(hold) * 8}


def c_cpu_spin(ctx, kw):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    ctx.send_status("RLIMIT_CPU %d %d" % (soft, hard))
    while True:
        pass


def c_sleep(ctx, kw):
    time.sleep(3600)
    return {"outcome": "woke"}


def c_rlimits(ctx, kw):
    import resource
    names = ("AS", "CPU", "FSIZE", "NOFILE", "NPROC", "STACK", "CORE")
    return {"outcome": " ".join("%s=%d" % (n, resource.getrlimit(getattr(resource, "RLIMIT_" + n))[1]) for n in names)}


def c_status_flood(ctx, kw):
    line = "x" * int(kw.get("size", 65536))
    for _ in range(int(kw.get("n", 2000))):
        ctx.send_status(line)
    return {"outcome": "flooded"}


def c_huge_result(ctx, kw):
    return {"outcome": "x" * (20 << 20)}


RAW_RESULTS = {
    "deep": lambda: b'{"result":' + b"[" * 100000 + b"]" * 100000 + b"}",
    "nonutf8": lambda: b'{"result":{"outcome":"bad \xff\xfe bytes"}}',
    "garbage": lambda: b"\x00\x01 not json",
}


def c_raw_result(ctx, kw):
    """Replaces the runner's result writers (a tool runs in the runner's
    process): the result becomes raw bytes of the attacker's choosing,
    in result.json (a cold call) or on the call's socket (a template
    call, framed as the runner frames it)."""
    import __main__
    runner = __main__.runner
    raw = RAW_RESULTS[kw["kind"]]()

    def writer(path, document):
        with open(path, "wb") as f:
            f.write(raw)

    def sender(sock, document, chunk):
        runner._send(sock, {"type": "result", "size": len(raw)})
        for i in range(0, len(raw), chunk):
            sock.sendmsg([raw[i:i + chunk]])
    runner._write_result = writer
    runner._send_result = sender
    return {"outcome": "replaced"}


def c_environment(ctx, kw):
    secret = kw["secret"].encode()
    found = []
    if any(secret in (k + "=" + v).encode() for k, v in os.environ.items()):
        found.append("os.environ")
    for p in os.listdir("/proc"):
        if p.isdigit() or p == "self":
            for f in ("environ", "cmdline"):
                try:
                    if secret in read("/proc/%s/%s" % (p, f), 1 << 20):
                        found.append("/proc/%s/%s" % (p, f))
                except OSError:
                    pass
    return {"outcome": "found:%d" % len(found), "found": found, "env": sorted(os.environ)}


def c_identity(ctx, kw):
    mid = []
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            mid.append(read(p).decode().strip())
        except OSError as e:
            mid.append(en(e))
    return {"outcome": socket.gethostname() + " " + " ".join(mid), "boot_id": read("/proc/sys/kernel/random/boot_id").decode().strip()}


def c_concurrent_nproc(ctx, kw):
    """Holds as many processes as it may, reports when full, and keeps
    them until "release" exists in the shared rendezvous dir... which does
    not exist: each sandbox only sees its own files, so this simply holds
    for kw["hold"] seconds."""
    kids = []
    try:
        for _ in range(10000):
            pid = os.fork()
            if pid == 0:
                time.sleep(float(kw["hold"]))
                os._exit(0)
            kids.append(pid)
    except OSError as e:
        outcome = en(e)
    else:
        outcome = "ok"
    ctx.send_status("holding %d" % len(kids))
    time.sleep(float(kw["hold"]))
    for k in kids:
        os.kill(k, signal.SIGKILL)
        os.waitpid(k, 0)
    return {"outcome": outcome, "forked": len(kids)}


def c_fork_one(ctx, kw):
    p = subprocess.run(["/bin/sh", "-c", "echo child"], capture_output=True, text=True)
    return {"outcome": p.stdout.strip()}


def c_holder(ctx, kw):
    ctx.send_status("holding")
    time.sleep(float(kw["hold"]))
    return {"outcome": "released"}


def c_cgroup_probe(ctx, kw):
    """Starts a child with marker on its command line (the harness finds
    its cgroup from the host), reports its own view of /proc/self/cgroup,
    and holds for kw["hold"] seconds."""
    child = subprocess.Popen(["/bin/sleep", "600." + kw["marker"]])
    ctx.send_status("probing " + read("/proc/self/cgroup").decode().strip().replace("\n", ";"))
    time.sleep(float(kw["hold"]))
    child.kill()
    child.wait()
    return {"outcome": "released"}


def c_save_artifact(ctx, kw):
    try:
        ctx.save_artifact(kw["name"], b"x")
        return {"outcome": "saved"}
    except (ValueError, OSError) as e:
        return {"outcome": type(e).__name__}


def c_load_artifact(ctx, kw):
    return {"outcome": repr(ctx.load_artifact_text("f"))}


def attack(ctx, case, **kw):
    return CASES[case](ctx, kw)


def c_raw_output(ctx, kw):
    """Creates output files directly (not through save_artifact and its
    name check): the worker's collection must judge the names."""
    for name in kw["names"]:
        write(os.path.join(ctx._output_dir, name), b"planted")
    ctx.save_artifact_text("ok.txt", "fine")
    return {"outcome": "planted"}


def c_fill_dir(ctx, kw):
    """Fills a directory with files of 16 MiB (each below RLIMIT_FSIZE)
    until an error, at most kw["limit"] bytes; removes them unless
    kw["keep"] (the work dir left full: the runner's result.json is on a
    tmpfs of its own, launcher step L9, so the answer gets out)."""
    d = kw["dir"]
    total, i, code = 0, 0, "ok"
    limit = int(kw.get("limit", 1 << 30))
    while total < limit:
        code, n = fill(os.path.join(d, "fill%d" % i), limit=16 << 20)
        total += n
        i += 1
        if code != "ok":
            break
    if not kw.get("keep"):
        for j in range(i):
            try:
                os.unlink(os.path.join(d, "fill%d" % j))
            except OSError:
                pass
    return {"outcome": code, "bytes": total}


CASES = {k[2:]: v for k, v in globals().items() if k.startswith("c_")}
