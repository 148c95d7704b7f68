"""The tool of the warm pool's isolation test (warm_test.go): traces with
mode "leave" writes to every writable place it has and leaves a process
running; with mode "find" it looks for all of it."""
import os
import subprocess

TRACES = []
MARK = "str-warm-trace"
CANDIDATES = [".", "output", "/tmp", "/dev/shm", "/var/tmp", "/run", "/home", "/root", "/"]


def _places():
    places = []
    for d in CANDIDATES + [os.environ.get("HOME", "/")]:
        p = os.path.abspath(d)
        if p not in places:
            places.append(p)
    return places


def traces(ctx, mode="find"):
    if mode == "leave":
        return _leave()
    return _find()


def _leave():
    written = []
    for d in _places():
        try:
            with open(os.path.join(d, MARK), "w") as f:
                f.write("left by an earlier call")
            written.append(d)
        except OSError:
            pass
    TRACES.append(MARK)
    os.environ["STR_WARM_TRACE"] = MARK
    # A process that outlives the call, writing a trace again and again.
    script = "while true; do echo x > /tmp/%s.bg; sleep 0.05; done" % MARK
    bg = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"written": written, "background_pid": bg.pid, "cwd": os.getcwd()}


def _find():
    found = []
    for d in _places():
        for name in (MARK, MARK + ".bg"):
            if os.path.exists(os.path.join(d, name)):
                found.append(os.path.join(d, name))
    if TRACES:
        found.append("module global TRACES=%r" % TRACES)
    if "STR_WARM_TRACE" in os.environ:
        found.append("environment STR_WARM_TRACE")
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = "?"
            found.append("process %s: %s" % (entry, cmd))
    return {"found": found, "cwd": os.getcwd(), "pid": me}


def inputs(ctx, files=None, primary=None):
    """The reference defaults test's tool (warm_test.go): every input
    artifact's text by parameter, and what input/ holds."""
    return {"text": {p: ctx.load_artifact_text(p) for p in ctx.list_artifacts()},
            "input": sorted(os.listdir("input"))}
