"""Tools used by the end-to-end tests."""
import os
import time


def many_lines(ctx, n=1000):
    for i in range(int(n)):
        ctx.send_status("line %d" % i)
    return {"n": n}


def sleeper(ctx, seconds=1.0):
    ctx.send_status("sleeping")
    time.sleep(float(seconds))
    return {"slept": seconds}


def read_inputs(ctx, a, b, shared):
    ctx.save_artifact_text("result.txt", "%s|%s|%s" % (
        ctx.load_artifact_text("a"), ctx.load_artifact_text("b"), ctx.load_artifact_text("shared")))
    os.symlink("/etc/passwd", os.path.join(os.path.dirname(ctx.save_artifact("data.csv", b"x,y\n")), "evil.txt"))
    return {"a": ctx.load_artifact_text("a"), "b": ctx.load_artifact_text("b"), "shared": ctx.load_artifact_text("shared")}


def crash(ctx):
    ctx.send_status("about to die")
    os._exit(3)
