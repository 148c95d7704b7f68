"""Import-time code that rewrites the runner's setup in every child: the
uid change becomes a no-op, so the call would run with the template's
identity. The supervisor's verification must catch it before any call
data is sent, kill the child and retire the template."""
import os

os.setresuid = lambda *a: None


def run():
    return {"ran": True, "uid": os.getuid()}
