"""A hostile tool for a per-tool template: at import (in the template) and
at call time (in its child) it tries every way to a namespace or a mount
(each must fail with EPERM: the filters refuse every one, move_mount
included, which the supervisor performs from the host)."""
import ctypes
import errno
import os
import socket

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
if os.uname().machine == "aarch64":
    _NR = {"clone": 220, "unshare": 97, "setns": 268, "mount": 40, "move_mount": 429}
else:
    _NR = {"clone": 56, "unshare": 272, "setns": 308, "mount": 165, "move_mount": 429}
_CALL = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x02000000
_FLAGS = {"NEWUSER": 0x10000000, "NEWNS": 0x00020000, "NEWPID": 0x20000000, "NEWNET": 0x40000000,
          "NEWIPC": 0x08000000, "NEWUTS": 0x04000000, "NEWCGROUP": 0x02000000, "NEWTIME": 0x80}


def _sys(name, *args):
    r = _libc.syscall(ctypes.c_long(_NR[name]), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if r == 0 and name == "clone":
        os._exit(0)  # a clone that was let through: the copy leaves (the parent reports "OK")
    if r >= 0:
        return "OK"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def attempts():
    out = {}
    for n, f in _FLAGS.items():
        out["unshare " + n] = _sys("unshare", f)
    out["clone call flags"] = _sys("clone", _CALL | 17, 0, 0, 0, 0)
    for n, f in _FLAGS.items():
        if n != "NEWTIME":
            out["clone " + n] = _sys("clone", f | 17, 0, 0, 0, 0)
    fd = os.open("/proc/self/ns/net" if os.path.exists("/proc/self/ns/net") else "/", os.O_RDONLY)
    out["setns"] = _sys("setns", fd, 0)
    os.close(fd)
    out["mount"] = _sys("mount", b"none", b"/tmp", b"tmpfs", 0, None)
    out["move_mount"] = _sys("move_mount", -1, b"", -100, b"/tmp", 4)
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
        out["netlink"] = "OK"
    except OSError as e:
        out["netlink"] = errno.errorcode.get(e.errno, str(e.errno))
    return out


AT_IMPORT = attempts()


def run():
    return {"import": AT_IMPORT, "call": attempts()}
