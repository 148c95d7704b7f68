"""str tool runner: runs one tool call inside a str sandbox.

Usage: python3 runner.py /path/to/runner_args.json

This file is embedded in the str worker (package worker/runner) and placed
read-only into every sandbox. It uses the Python standard library only and
runs on Python 3.9 or newer. What it does, in order:

  1. read runner_args.json (keys of spec section 7.3);
  2. import the tool's module (the tools directory is on PYTHONPATH) and
     find the function, or instantiate class_name and take its method;
     any failure here is reported with error_kind "import";
  3. build the context object (ctx) and the call arguments following the
     calling convention of spec section 8;
  4. call the tool (an "async def" tool runs under asyncio.run);
     an exception is reported with error_kind "execution", an exception
     whose class (or a base class) is named ToolError with error_kind "tool";
  5. normalise the return value to a JSON object (spec section 3);
  6. write result_file atomically (temporary file, fsync, rename) as
     {"result": {...}} or {"error": "...", "error_kind": "..."}.

Exit status: 0 when a result file was written (even one carrying an error),
2 when no result file could be written (unreadable arguments, unwritable
result path). Nothing the tool prints on stdout or stderr is interpreted.

Input artifacts: a tool parameter that is not among the args but names an
input artifact (a key of artifact_paths) receives the artifact's local path;
a list-valued artifact parameter ("p[0]", "p[1]", ...) receives the list of
paths. The bytes are read with ctx.load_artifact(param) as usual.

Class-based tools: when class_name is set, the class is instantiated with
no arguments, or with tool_config=<the tool config> when its constructor
has a parameter named tool_config. The method called is the attribute named
by "function"; only when "function" is empty does the runner fall back to
the instance's __call__ (if the class defines one) and then to its "run".

Tools may "import str_tool" (registered by this runner) to reach ToolError,
ToolContext and ToolContextFacade; ctx.ToolError is the same class.
"""

import importlib
import inspect
import json
import math
import os
import stat
import sys
import threading
import traceback
import types

TRACEBACK_TAIL_LINES = 20
EXIT_NO_RESULT = 2

# Annotation names that mark a parameter as "receives the context object".
FACADE_ANNOTATION_NAMES = ("ToolContextFacade", "ToolContext")


class ToolError(Exception):
    """Raised by a tool to report a tool-level error (TOOL_ERROR).

    Any exception whose class, or one of its base classes, is named
    ToolError counts, so tools written against other runtimes work too.
    """


def _unsafe_filename_reason(filename):
    """Returns why filename is not a safe output name, or None if it is."""
    if not isinstance(filename, str):
        return "filename must be a str, not %s" % type(filename).__name__
    if filename == "":
        return "filename is empty"
    if filename in (".", ".."):
        return "filename %r is a directory reference" % filename
    if "\x00" in filename:
        return "filename contains a NUL byte"
    if "/" in filename or "\\" in filename:
        return "filename %r contains a path separator" % filename
    if os.path.isabs(filename):
        return "filename %r is absolute" % filename
    return None


class ToolContext:
    """The ctx object handed to tools (spec section 8)."""

    ToolError = ToolError

    def __init__(self, run_args):
        self.user_id = run_args.get("user_id") or ""
        self.session_id = run_args.get("session_id") or ""
        self.app_name = run_args.get("app_name") or ""
        self._tool_config = dict(run_args.get("tool_config") or {})
        self._artifact_paths = dict(run_args.get("artifact_paths") or {})
        self._artifact_metadata = dict(run_args.get("artifact_metadata") or {})
        self._status_pipe = run_args.get("status_pipe") or ""
        self._output_dir = run_args.get("output_dir") or ""
        self._output_mime_types = {}
        # One status line per open/write/close; the lock keeps lines from
        # threads of one tool from interleaving when a line exceeds PIPE_BUF.
        self._status_lock = threading.Lock()

    # -- status -----------------------------------------------------------

    def send_status(self, msg):
        """Sends one status line to the worker. Returns False on any error."""
        try:
            data = (json.dumps({"status": str(msg)}) + "\n").encode("utf-8")
        except Exception:
            return False
        if not self._status_pipe:
            return False
        with self._status_lock:
            fd = -1
            try:
                # O_NONBLOCK so that a missing reader fails (ENXIO) instead
                # of hanging the tool; the write itself is then blocking so
                # that a full pipe delays the tool rather than losing a line.
                fd = os.open(
                    self._status_pipe,
                    os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                )
                if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                    return False
                os.set_blocking(fd, True)
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                return True
            except Exception:
                return False
            finally:
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass

    # -- input artifacts ----------------------------------------------------

    def load_artifact(self, param):
        """Returns the bytes of the input artifact for param, or None."""
        path = self._artifact_paths.get(param)
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def load_artifact_text(self, param, encoding="utf-8"):
        """Returns the input artifact for param decoded as text, or None."""
        data = self.load_artifact(param)
        if data is None:
            return None
        return data.decode(encoding)

    def list_artifacts(self):
        """Returns {param: local path} of the input artifacts."""
        return dict(self._artifact_paths)

    def get_artifact_metadata(self, param):
        """Returns {filename, mime_type, version, local_path} for param, or None."""
        meta = self._artifact_metadata.get(param)
        return dict(meta) if isinstance(meta, dict) else None

    # -- output artifacts ---------------------------------------------------

    def save_artifact(self, filename, content, mime_type=None):
        """Writes content into the output directory; returns the file's path.

        Raises ValueError for an unsafe filename (empty, "." or "..", a path
        separator, absolute, NUL). str content is encoded as UTF-8.
        """
        reason = _unsafe_filename_reason(filename)
        if reason is not None:
            raise ValueError("unsafe artifact filename: " + reason)
        if isinstance(content, str):
            content = content.encode("utf-8")
        elif isinstance(content, (bytearray, memoryview)):
            content = bytes(content)
        elif not isinstance(content, bytes):
            raise TypeError(
                "artifact content must be bytes or str, not %s" % type(content).__name__
            )
        if not self._output_dir:
            raise ValueError("no output directory was given to this tool run")
        path = os.path.join(self._output_dir, filename)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        if mime_type:
            self._output_mime_types[filename] = str(mime_type)
        else:
            self._output_mime_types.pop(filename, None)
        return path

    def save_artifact_text(self, filename, text, mime_type=None):
        """Writes text (UTF-8) into the output directory; returns the path."""
        return self.save_artifact(filename, str(text).encode("utf-8"), mime_type)

    def list_output_artifacts(self):
        """Returns the sorted names of the regular files in the output directory."""
        names = []
        if not self._output_dir:
            return names
        try:
            with os.scandir(self._output_dir) as it:
                for entry in it:
                    if entry.is_file(follow_symlinks=False):
                        names.append(entry.name)
        except OSError:
            return []
        return sorted(names)

    # -- configuration --------------------------------------------------------

    def get_config(self, key, default=None):
        """Returns tool_config[key], or default."""
        return self._tool_config.get(key, default)


# --------------------------------------------------------------------------
# Loading the tool


class _ImportFailure(Exception):
    pass


def _load_callable(run_args):
    """Step 2: returns the callable to run. Raises _ImportFailure."""
    module_name = run_args.get("module") or ""
    function_name = run_args.get("function") or ""
    class_name = run_args.get("class_name") or ""
    if not module_name:
        raise _ImportFailure("no module given in runner arguments")
    try:
        module = importlib.import_module(module_name)
    except BaseException as e:  # module code may raise anything, even SystemExit
        raise _ImportFailure(
            "cannot import module %r: %s" % (module_name, _describe(e, with_traceback=True))
        )
    if not class_name:
        if not function_name:
            raise _ImportFailure("no function given in runner arguments")
        fn = getattr(module, function_name, None)
        if fn is None:
            raise _ImportFailure(
                "module %r has no attribute %r" % (module_name, function_name)
            )
        if not callable(fn):
            raise _ImportFailure(
                "%s.%s is not callable (%s)" % (module_name, function_name, type(fn).__name__)
            )
        return fn
    cls = getattr(module, class_name, None)
    if cls is None:
        raise _ImportFailure("module %r has no attribute %r" % (module_name, class_name))
    if not inspect.isclass(cls):
        raise _ImportFailure("%s.%s is not a class" % (module_name, class_name))
    try:
        kwargs = {}
        try:
            if "tool_config" in inspect.signature(cls).parameters:
                kwargs["tool_config"] = dict(run_args.get("tool_config") or {})
        except (TypeError, ValueError):
            pass
        instance = cls(**kwargs)
    except BaseException as e:
        raise _ImportFailure(
            "cannot instantiate %s.%s: %s" % (module_name, class_name, _describe(e, with_traceback=True))
        )
    if function_name:
        fn = getattr(instance, function_name, None)
        if fn is None or not callable(fn):
            raise _ImportFailure(
                "%s.%s has no callable attribute %r" % (module_name, class_name, function_name)
            )
        return fn
    if "__call__" in {name for klass in type(instance).__mro__[:-1] for name in vars(klass)}:
        return instance
    fn = getattr(instance, "run", None)
    if fn is None or not callable(fn):
        raise _ImportFailure(
            "%s.%s has neither __call__ nor run and no function was named" % (module_name, class_name)
        )
    return fn


# --------------------------------------------------------------------------
# Calling convention (spec section 8)


def _is_facade_annotation(annotation):
    if annotation is inspect.Parameter.empty:
        return False
    if annotation is ToolContext:
        return True
    if isinstance(annotation, str):
        name = annotation.strip().strip("'\"").rsplit(".", 1)[-1]
        return name in FACADE_ANNOTATION_NAMES
    if inspect.isclass(annotation):
        return annotation.__name__ == "ToolContextFacade"
    return False


def _build_call(fn, ctx, args, tool_config):
    """Step 3: returns (positional, keyword) arguments for fn.

    Spec section 8: when the first parameter is unannotated, positional,
    not among the args (nor an input artifact parameter, nor named
    tool_config), it receives ctx and the args go as keyword arguments;
    otherwise the args go as keyword arguments alone. In both cases a
    parameter not among the args named tool_config receives the tool
    config, one annotated as the context facade (ToolContextFacade or
    ToolContext, as a class or a string) receives ctx, and one naming an
    input artifact receives its local path (see the module docstring).
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        # No signature available (some builtins): args as keywords alone.
        return [], dict(args)
    params = list(sig.parameters.values())
    positional = []
    kwargs = dict(args)
    rest = params
    artifact_params = _artifact_params(ctx.list_artifacts())
    if params:
        first = params[0]
        if (
            first.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            and first.annotation is inspect.Parameter.empty
            and first.name not in args
            and first.name not in artifact_params
            and first.name != "tool_config"
        ):
            positional.append(ctx)
            rest = params[1:]
    for p in rest:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.name in args:
            continue
        if p.name == "tool_config":
            kwargs["tool_config"] = tool_config
        elif _is_facade_annotation(p.annotation):
            kwargs[p.name] = ctx
        elif p.name in artifact_params:
            kwargs[p.name] = artifact_params[p.name]
    try:
        sig.bind(*positional, **kwargs)
    except TypeError as e:
        raise TypeError("arguments do not match the tool's signature %s: %s" % (sig, e))
    return positional, kwargs


def _artifact_params(paths):
    """Maps input artifact parameters to values for the tool's parameters.

    A parameter "p" with an input artifact receives its local path; a
    list-valued parameter ("p[0]", "p[1]", ...) receives the list of paths
    in index order.
    """
    single = {}
    lists = {}
    for key, path in paths.items():
        if key.endswith("]") and "[" in key:
            name, _, index = key[:-1].partition("[")
            if index.isdigit():
                lists.setdefault(name, []).append((int(index), path))
                continue
        single[key] = path
    for name, items in lists.items():
        if name not in single:
            single[name] = [path for _, path in sorted(items)]
    return single


async def _await(awaitable):
    return await awaitable


def _run_tool(fn, positional, kwargs):
    """Step 4: calls fn; runs a coroutine to completion."""
    result = fn(*positional, **kwargs)
    if inspect.isawaitable(result):
        # Imported here, not at the top: asyncio costs ~35 ms of start-up
        # and only async tools need it.
        import asyncio

        result = asyncio.run(_await(result))
    return result


# --------------------------------------------------------------------------
# Results (spec section 3)


def _json_safe(value, depth=0, seen=None):
    """Returns a strictly JSON-encodable copy of value (str for the rest)."""
    if seen is None:
        seen = set()
    if depth > 200:
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return "<circular reference>"
        seen = seen | {id(value)}
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                key = k if isinstance(k, str) else str(k)
                out[key] = _json_safe(v, depth + 1, seen)
            return out
        return [_json_safe(v, depth + 1, seen) for v in value]
    return str(value)


def _normalise(value):
    """Step 5: the tool_result object."""
    if isinstance(value, dict):
        try:
            json.dumps(value, allow_nan=False)
            return value
        except (TypeError, ValueError, RecursionError):
            return _json_safe(value)
    if value is None:
        return {"text": None, "data_objects": []}
    if isinstance(value, str):
        return {"text": value, "data_objects": []}
    return {"text": str(value), "data_objects": []}


def _describe(exc, with_traceback):
    text = "%s: %s" % (type(exc).__name__, exc)
    if with_traceback:
        lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        tail = lines.rstrip("\n").split("\n")[-TRACEBACK_TAIL_LINES:]
        text += "\n" + "\n".join(tail)
    return text


def _is_tool_error(exc):
    return any(klass.__name__ == "ToolError" for klass in type(exc).__mro__)


def _write_result(path, document):
    """Step 6: writes document to path atomically (temp, fsync, rename)."""
    data = json.dumps(document, allow_nan=False).encode("utf-8")
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, ".%s.tmp.%d" % (os.path.basename(path), os.getpid()))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _error(text, kind):
    return {"error": text, "error_kind": kind}


def main(argv):
    # The runner's own directory must not shadow tool modules.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]

    # 1. read the arguments
    if len(argv) != 2:
        sys.stderr.write("usage: runner.py RUNNER_ARGS_JSON\n")
        return EXIT_NO_RESULT
    try:
        with open(argv[1], "rb") as f:
            run_args = json.loads(f.read().decode("utf-8"))
        if not isinstance(run_args, dict):
            raise ValueError("runner arguments are not a JSON object")
        result_file = run_args.get("result_file")
        if not isinstance(result_file, str) or not result_file:
            raise ValueError("runner arguments have no result_file")
    except Exception as e:
        sys.stderr.write("str runner: cannot read %s: %s\n" % (argv[1], e))
        return EXIT_NO_RESULT

    document = _run(run_args)

    try:
        _write_result(result_file, document)
    except Exception as e:
        sys.stderr.write("str runner: cannot write result %s: %s\n" % (result_file, e))
        return EXIT_NO_RESULT
    return 0


def _run(run_args):
    """Steps 2-5; returns the result document."""
    args = run_args.get("args")
    if args is None:
        args = {}
    tool_config = run_args.get("tool_config")
    if tool_config is None:
        tool_config = {}
    if not isinstance(args, dict) or not isinstance(tool_config, dict):
        return _error("runner arguments: args and tool_config must be JSON objects", "execution")

    _register_facade_module()

    # 2. import
    try:
        fn = _load_callable(run_args)
    except _ImportFailure as e:
        return _error(str(e), "import")

    # 3. context and call arguments
    ctx = ToolContext(run_args)
    try:
        positional, kwargs = _build_call(fn, ctx, args, tool_config)
    except TypeError as e:
        return _error("TypeError: %s" % e, "execution")

    # 4. run
    try:
        value = _run_tool(fn, positional, kwargs)
    except BaseException as e:
        if _is_tool_error(e):
            return _error(str(e) or type(e).__name__, "tool")
        return _error(_describe(e, with_traceback=True), "execution")

    # 5. normalise
    document = {"result": _normalise(value)}
    if ctx._output_mime_types:
        document["output_mime_types"] = dict(ctx._output_mime_types)
    return document


def _register_facade_module():
    mod = types.ModuleType("str_tool")
    mod.__doc__ = "Names a str tool may import while running under the str runner."
    mod.ToolError = ToolError
    mod.ToolContext = ToolContext
    mod.ToolContextFacade = ToolContext
    sys.modules.setdefault("str_tool", mod)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except SystemExit:
        raise
    except BaseException as e:  # a runner bug: never leave silently
        sys.stderr.write("str runner: internal error: %s\n" % _describe(e, with_traceback=True))
        sys.exit(EXIT_NO_RESULT)
