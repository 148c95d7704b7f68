"""Shared by the hostile_skip_* tools: import-time code that makes every
template child skip one step of its setup (the runner's own code, patched
in the template before its first fork). The supervisor's verification
(C9) must catch each skip before any call data is sent."""
import sys



def _runner_globals():
    """The runner module's globals: its _preload is importing us (runner.py
    dropped the module's name from sys.modules)."""
    f = sys._getframe()
    while f is not None:
        if "_template_prepare" in f.f_globals:
            return f.f_globals
        f = f.f_back
    raise RuntimeError("not imported by the str runner")


_runner = _runner_globals()


class _Libc:
    """The runner's libc handle with some calls replaced by no-ops."""

    def __init__(self, libc, prctl_ops=(), syscalls=(), then=None):
        self._libc, self._ops, self._nrs, self._then = libc, set(prctl_ops), set(syscalls), then

    def __getattr__(self, name):
        return getattr(self._libc, name)

    def prctl(self, op, *args):
        if op in self._ops:
            return 0
        return self._libc.prctl(op, *args)

    def syscall(self, nr, *args):
        if getattr(nr, "value", nr) in self._nrs:
            if self._then:
                self._then()
            return 0
        return self._libc.syscall(nr, *args)


def skip(prctl_ops=(), syscalls=(), then=None):
    """Every child's libc skips the prctl operations and system calls named
    (then runs then() in place of a skipped system call)."""
    prepare = _runner["_template_prepare"]

    def patched():
        libc = prepare()
        _runner["_TPL"]["libc"] = _Libc(libc, prctl_ops, syscalls, then)
        return libc  # the template's own fork keeps the real one

    _runner["_template_prepare"] = patched
