"""Example tools for str (spec §8). Plain Python functions: the runner
passes the context object as the first parameter when it is not one of the
arguments and is unannotated (`def echo_tool(ctx, ...)`) or annotated `Any`
or with the context facade (`def reference_echo(ctx: Any, ...)`, the
reference runtime's style); a function whose first parameter is annotated
otherwise gets its arguments alone.

Every call starts a fresh Python that imports this module, so it imports
only what every tool needs; a tool imports the rest itself (`socket` costs
about 5 ms, `typing` about 3 ms)."""

from __future__ import annotations

import errno
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # names for the annotations, which stay strings at run time
    from typing import Any, Dict


def echo_tool(ctx, message="Hello"):
    """Returns the message it was given."""
    ctx.send_status("echoing")
    return {"echo": message, "user_id": ctx.user_id, "session_id": ctx.session_id}


def reference_echo(ctx: Any, message: str = "Hello") -> Dict[str, Any]:
    """echo_tool in the reference runtime's signature: tools written for the
    reference run unmodified (the annotation "Any" marks ctx)."""
    ctx.send_status("echoing")
    return {"echo": message, "user_id": ctx.user_id, "session_id": ctx.session_id}


def process_file(ctx, input_file):
    """Counts the lines of the input artifact and saves summary.txt."""
    ctx.send_status("Loading input file...")
    text = ctx.load_artifact_text("input_file")
    lines = text.splitlines()
    ctx.send_status(f"Processing {len(lines)} lines...")
    summary = f"Lines: {len(lines)}\nWords: {len(text.split())}\n"
    ctx.save_artifact("summary.txt", summary.encode())
    ctx.save_artifact_text("upper.txt", text.upper())
    return {"status": "success", "lines": len(lines)}


def execute_python(ctx, code, timeout_hint=None):
    """Runs submitted code with exec and returns what it printed and the
    value of a variable named `result`, if set. The sandbox (restrictive
    profile) is the protection: this function adds none."""
    import contextlib
    import io

    out = io.StringIO()
    scope = {"__name__": "__submitted__"}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<submitted>", "exec"), scope)
    result = scope.get("result")
    return {"stdout": out.getvalue(), "result": repr(result) if result is not None else None}


def slow_operation(ctx, steps=5, delay=1.0):
    """Sleeps `steps` times, reporting progress before each step."""
    steps = int(steps)
    for i in range(steps):
        ctx.send_status(f"Step {i + 1} of {steps}")
        time.sleep(float(delay))
    ctx.send_status("done")
    return {"steps": steps}


def failing_tool(ctx, mode="tool"):
    """mode "tool": raises ToolError (TOOL_ERROR); anything else raises a
    plain exception (EXECUTION_ERROR)."""
    if mode == "tool":
        raise ctx.ToolError("the tool reports failure on purpose")
    raise RuntimeError("an unexpected exception, on purpose")


async def async_fetch(ctx, items=("a", "b", "c")):
    """Processes items concurrently with asyncio."""
    import asyncio  # here, not at the top: the other tools need not pay ~35 ms to import it


    async def one(item):
        await asyncio.sleep(0.05)
        return item.upper()

    ctx.send_status(f"gathering {len(items)} items")
    results = await asyncio.gather(*(one(i) for i in items))
    return {"results": list(results)}


def _attempt(name, fn):
    try:
        detail = fn()
        return {"attempt": name, "blocked": False, "detail": str(detail)[:200]}
    except BaseException as e:  # noqa: BLE001 - every failure is a result here
        return {"attempt": name, "blocked": True, "detail": f"{type(e).__name__}: {e}"[:200]}


def _read_shadow():
    with open("/etc/shadow") as f:
        return f.read(64)


def _mount():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return "mounted tmpfs on /tmp"


def _unshare():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWUSER = 0x10000000
    if libc.unshare(CLONE_NEWUSER) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return "created a user namespace"


def _connect_out():
    # The worker's own broker on the host's loopback: reachable only if
    # the sandbox shares the host network (it must not, in restrictive).
    # Loopback only: no test here ever sends traffic off the machine.
    import socket

    s = socket.create_connection(("127.0.0.1", 55554), timeout=2)
    s.close()
    return "connected to the host's 127.0.0.1:55554"


def _write_outside():
    with open("/usr/pwned", "w") as f:
        f.write("x")
    return "wrote /usr/pwned"


def _see_host_processes():
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    if len(pids) > 5:
        return f"sees {len(pids)} processes"
    raise PermissionError(errno.EPERM, f"only {len(pids)} processes visible: {pids}")


def escape_attempt(ctx):
    """Tries to break out and returns, for each attempt, whether it was
    blocked. Every attempt must be blocked in the restrictive profile."""
    attempts = [
        _attempt("read /etc/shadow", _read_shadow),
        _attempt("mount tmpfs", _mount),
        _attempt("unshare user namespace", _unshare),
        _attempt("connect to the host broker 127.0.0.1:55554", _connect_out),
        _attempt("write /usr", _write_outside),
        _attempt("see host processes", _see_host_processes),
    ]
    for a in attempts:
        ctx.send_status(f"{a['attempt']}: {'blocked' if a['blocked'] else 'NOT BLOCKED'}")
    return {"all_blocked": all(a["blocked"] for a in attempts), "attempts": attempts}


def http_get(ctx, url, max_bytes=65536):
    """Fetches a URL through the sandbox's egress proxy (urllib honours
    HTTPS_PROXY, which the sandbox sets). Its manifest entry narrows the
    network to restricted: hosts outside the allowlist are refused by the
    worker's proxy and reported in the reply's "violations"."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read(int(max_bytes))
            return {"status": r.status, "bytes": len(body), "head": body[:200].decode("utf-8", "replace")}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": e.reason, "proxy_reason": e.headers.get("X-Str-Reason")}
    except OSError as e:
        return {"status": None, "error": str(e)}


def api_call(ctx, url, token_env="API_TOKEN", max_bytes=65536):
    """Calls an HTTPS API with a key the tool never sees. The manifest
    entry's credentials: give this call $API_TOKEN as a placeholder
    ("str-placeholder-..."); the worker's egress proxy puts the real value
    into the Authorization header of requests to the credential's hosts
    only, and gives back any echo of it as the placeholder again."""
    import os
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + os.environ.get(token_env, "")})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read(int(max_bytes))
            return {"status": r.status, "head": body[:200].decode("utf-8", "replace")}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": e.reason, "proxy_reason": e.headers.get("X-Str-Reason")}
    except OSError as e:
        return {"status": None, "error": str(e)}


def self_check(ctx):
    """Reports what the sandbox looks like from inside, for a test (and an
    operator) to compare with what it must be: namespaces (the inode of
    each /proc/self/ns link: compare them with the host's), capability
    sets, seccomp mode, no_new_privs, mounts, visible processes, network
    interfaces, uid/gid and the user namespace's maps."""
    import socket

    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError as e:
            return "error: %s" % e.strerror

    def interfaces():
        # By netlink (if_nameindex), or from /proc/net/dev where netlink
        # is refused (a call of a per-tool template has none at all).
        try:
            return [name for _, name in socket.if_nameindex()]
        except PermissionError:
            return [line.split(":")[0].strip() for line in read("/proc/net/dev").splitlines()[2:]]

    namespaces = {}
    for ns in sorted(os.listdir("/proc/self/ns")):
        try:
            namespaces[ns] = os.stat("/proc/self/ns/" + ns).st_ino
        except OSError:
            namespaces[ns] = None
    status = {}
    for line in read("/proc/self/status").splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    mounts = []
    for line in read("/proc/self/mountinfo").splitlines():
        fields = line.split(" ")
        sep = fields.index("-")
        options = fields[5].split(",")
        mounts.append({"path": fields[4], "fstype": fields[sep + 1], "rw": "rw" in options})
    processes = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            processes[pid] = read("/proc/%s/comm" % pid).strip()
    return {
        "namespaces": namespaces,
        "capabilities": {k: status.get(k) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
        "seccomp": status.get("Seccomp"),
        "no_new_privs": status.get("NoNewPrivs"),
        "mounts": mounts,
        "processes": processes,
        "interfaces": interfaces(),
        "uid": list(os.getresuid()),
        "gid": list(os.getresgid()),
        "groups": os.getgroups(),
        "uid_map": read("/proc/self/uid_map").split(),
        "gid_map": read("/proc/self/gid_map").split(),
        "hostname": socket.gethostname(),
    }
