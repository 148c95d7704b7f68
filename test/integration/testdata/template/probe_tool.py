"""A tool run in a per-tool template (launcher/template): each call
reports what it sees of its own isolation."""
import errno
import os
import socket
import time

NS = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")


def probe(tag, hold=0):
    out = {"pid": os.getpid(), "tmp_before": sorted(os.listdir("/tmp"))}
    with open("/tmp/marker-" + tag, "w") as f:
        f.write(tag)
    out["ns"] = {n: os.stat("/proc/self/ns/" + n).st_ino for n in NS}
    with open("/proc/self/uid_map") as f:
        out["uid_map"] = f.read().split()
    with open("/proc/self/status") as f:
        st = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    for k in ("Seccomp", "CapEff", "CapBnd", "NoNewPrivs", "Uid"):
        out[k] = st[k].strip()
    out["procs"] = sorted(p for p in os.listdir("/proc") if p.isdigit())
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
        out["netlink"] = "OK"
    except OSError as e:
        out["netlink"] = errno.errorcode.get(e.errno, str(e.errno))
    out["lo_up"] = open("/sys/class/net/lo/operstate").read().strip() if os.path.exists("/sys/class/net/lo/operstate") else "?"
    time.sleep(hold)
    return out


def workdir(name):
    """Reads the input the host put in the call's work dir, writes an
    output there, lists it."""
    with open("/work/in.txt") as f:
        got = f.read()
    with open("/work/out-" + name + ".txt", "w") as f:
        f.write(name)
    return {"in": got, "ls": sorted(os.listdir("/work")), "uid": os.getuid()}


def big(kib):
    """Returns a result of about kib KiB: larger than one socket buffer."""
    return {"blob": "x" * (int(kib) << 10)}
