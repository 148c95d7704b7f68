"""str tool runner entry point: python3 runner.py [--done-fd N] RUNNER_ARGS_JSON
(or, in a warm sandbox of the worker's pool: --warm ARGS_FD MODULE FUNCTION [CLASS_NAME])

The runner itself is _str_runner.py, next to this file: read its docstring
for what a run does, the calling convention and the result file. This
entry point only imports it and calls its entry().

Why two files: Python compiles the script it is given on every start, but
loads an imported module from its cached bytecode. Compiling the runner
costs about 5 ms of CPU, a third of a bare "python3 -c pass", on every tool
call; loading it from __pycache__ costs about 0.5 ms. The worker writes the
cache with runner.Compile as a checked-hash .pyc (Python re-hashes the
source before it uses the cache, so a stale or foreign cache is ignored).
Without a cache the module is compiled from source, as a script would be.

Exit status 2 when the runner cannot be loaded (as when no result file
could be written).
"""

import os
import sys


def _load_runner():
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    # Only this directory while importing: a tool module named _str_runner
    # on PYTHONPATH must not stand in for the runner.
    sys.path[:] = [here]
    try:
        import _str_runner
    finally:
        sys.path[:] = saved
    # Forget the name, so that a tool module of that name stays importable.
    del sys.modules["_str_runner"]
    return _str_runner


if __name__ == "__main__":
    try:
        runner = _load_runner()
    except BaseException as e:  # noqa: BLE001 - any failure means no result
        sys.stderr.write("str runner: cannot load _str_runner.py: %s: %s\n" % (type(e).__name__, e))
        sys.exit(2)
    sys.exit(runner.entry(sys.argv))
