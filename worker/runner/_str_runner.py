"""str tool runner: runs one tool call inside a str sandbox.

Usage: python3 runner.py [--done-fd N] /path/to/runner_args.json
       python3 runner.py [--done-fd N] --warm ARGS_FD MODULE FUNCTION [CLASS_NAME]

runner.py is a small entry point that imports this module (from its
cached bytecode when the worker compiled it) and calls entry(). Both files
are embedded in the str worker (package worker/runner) and placed read-only
into every sandbox. They use the Python standard library only and run on
Python 3.9 or newer. What the runner does, in order:

  1. read runner_args.json (keys of spec section 7.3);
  2. import the tool's module (the tools directory is on PYTHONPATH) and
     find the function, or instantiate class_name and take its method;
     any failure here is reported with error_kind "import";
  3. build the context object (ctx) and the call arguments following the
     calling convention (below);
  4. call the tool (an "async def" tool, or any awaitable it returns, runs
     under asyncio.run);
     an exception is reported with error_kind "execution", an exception
     whose class (or a base class) is named ToolError with error_kind "tool";
  5. normalise the return value to a JSON object (spec section 3);
  6. write result_file atomically (temporary file, rename) as
     {"result": {...}} or {"error": "...", "error_kind": "..."}.

Done signal (--done-fd N, a pipe from the worker): after the result file
is complete (step 6) the runner writes one byte "d" on it, so the worker
can answer before this process and its sandbox are gone. The byte is only
a hint: the worker reads result.json itself, and a missing or early byte
(a tool can write on the descriptor too) makes it wait for the exit.

Warm mode (--warm ARGS_FD MODULE FUNCTION [CLASS_NAME]), for the worker's
pool of pre-started sandboxes: the runner first does everything that does
not depend on the call (registers str_tool, imports MODULE, and asyncio
when FUNCTION is a coroutine function, plus the modules it would import
lazily), writes "r" on the done descriptor, then reads the runner
arguments as JSON from ARGS_FD up to EOF and goes on exactly as a cold
run from step 1 (an import failure of MODULE is reported then, as step 2
would; the module is not imported twice). Each warm runner serves one
call.

Exit status: 0 when a result file was written (even one carrying an error),
2 when no result file could be written (unreadable arguments, unwritable
result path). Nothing the tool prints on stdout or stderr is interpreted.

Calling convention (spec section 8): the first parameter receives ctx
when it is positional, not among the args, not an input artifact
parameter, not named tool_config, and either unannotated or annotated
Any (typing.Any, "Any", object) or with the context facade
(ToolContextFacade or ToolContext, a class or a string); the args go as
keyword arguments. So both generations of reference tools,
"def f(ctx, x)" and "def f(ctx: Any, x)", get ctx, and a plain
"def hello(name: str)" gets its args alone. Any other parameter not among
the args receives the tool config when it is named tool_config, ctx when
it is annotated with the facade, and an input artifact as below. Strings
(from "from __future__ import annotations") count like the names they
spell, by their last dotted part ("typing.Any" is Any).

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

Start-up cost: every call starts a fresh Python, so the runner imports
almost nothing beyond what the interpreter has already loaded (os, stat,
sys, _thread, _json). The parameters are read from the function's code
object (fn.__code__, __annotations__, __defaults__, __kwdefaults__) rather
than with inspect, which is imported only for unusual callables (callable
instances, functools.partial, decorated functions with __wrapped__,
builtins) and to word a signature mismatch. JSON goes through _json, the C
accelerator the json package itself uses, because "import json" also
imports re (about 5 ms); if _json is missing or its interface differs, the
runner imports json. traceback is imported only to format an error,
asyncio only for an awaitable result.
"""

import _thread
import os
import stat
import sys

TRACEBACK_TAIL_LINES = 20
EXIT_NO_RESULT = 2

# Annotation names that mark a parameter as "receives the context object".
FACADE_ANNOTATION_NAMES = ("ToolContextFacade", "ToolContext")
# Annotation names that let the first parameter receive the context object
# (besides the facade names): the reference's "ctx: Any".
ANY_ANNOTATION_NAMES = ("Any", "object")


# --------------------------------------------------------------------------
# JSON without importing json (which imports re)


class _ScanContext:
    """The attributes _json.make_scanner reads: json.JSONDecoder's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {
        "-Infinity": float("-inf"),
        "Infinity": float("inf"),
        "NaN": float("nan"),
    }.__getitem__


_JSON_WHITESPACE = " \t\n\r"


def _json_loads(text):
    """json.loads(text) for a str, through the C scanner when available."""
    try:
        from _json import make_scanner

        scan = make_scanner(_ScanContext())
    except Exception:  # no accelerator, or an interface this runner does not know
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(_JSON_WHITESPACE))
    try:
        value, end = scan(text, start)
    except StopIteration:
        raise ValueError("expecting a JSON value at offset %d" % start) from None
    if text[end:].strip(_JSON_WHITESPACE):
        raise ValueError("extra data after the JSON value at offset %d" % end)
    return value


def _not_serializable(value):
    raise TypeError("Object of type %s is not JSON serializable" % type(value).__name__)


def _json_dumps(value):
    """json.dumps(value, allow_nan=False), byte for byte, without json.

    The arguments are those json.JSONEncoder passes to the C encoder for
    its defaults (circular check, ", " and ": ", ASCII output).
    """
    try:
        from _json import encode_basestring_ascii, make_encoder

        encode = make_encoder(
            {}, _not_serializable, encode_basestring_ascii, None, ": ", ", ", False, False, False
        )
    except Exception:  # no accelerator, or an interface this runner does not know
        import json

        return json.dumps(value, allow_nan=False)
    return "".join(encode(value, 0))


class ToolError(Exception):
    """Raised by a tool to report a tool-level error (TOOL_ERROR).

    Any exception whose class, or one of its base classes, is named
    ToolError counts, so tools written against other runtimes work too.
    """


def _unsafe_filename_reason(filename):
    """Returns why filename is not a safe output name, or None if it is.

    The rule is the worker's (Go: worker/artifacts CheckFilename), so a
    name the runner accepts is one the worker stores: valid UTF-8; after
    an optional "user:" prefix, and again after NFKC normalisation, not
    empty, not "." or "..", not absolute, no "/" or "\\", no control
    character (Unicode category Cc), at most 255 bytes. unicodedata is
    imported here, not at the top, to keep the runner's start cheap.
    """
    if not isinstance(filename, str):
        return "filename must be a str, not %s" % type(filename).__name__
    import unicodedata

    try:
        filename.encode("utf-8")  # lone surrogates (surrogateescape) are not UTF-8
    except UnicodeEncodeError:
        return "filename is not valid UTF-8"
    for form in (filename, unicodedata.normalize("NFKC", filename)):
        rest = form[5:] if form.startswith("user:") else form
        if rest == "":
            return "filename is empty"
        if rest in (".", ".."):
            return "filename %r is a directory reference" % filename
        if rest.startswith("/"):
            return "filename %r is an absolute path" % filename
        if "/" in rest or "\\" in rest:
            return "filename %r contains a path separator" % filename
        if any(unicodedata.category(c) == "Cc" for c in rest):
            return "filename %r contains a control character" % filename
        if len(rest.encode("utf-8")) > 255:
            return "filename %r is longer than 255 bytes" % filename
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
        # (_thread, not threading: threading costs ~4 ms of start-up.)
        self._status_lock = _thread.allocate_lock()

    # -- status -----------------------------------------------------------

    def send_status(self, msg):
        """Sends one status line to the worker. Returns False on any error."""
        try:
            data = (_json_dumps({"status": str(msg)}) + "\n").encode("utf-8")
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

        Raises ValueError for a filename the worker would not store (the
        rule of _unsafe_filename_reason). str content is encoded as UTF-8.
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


def _import_module(name):
    """importlib.import_module(name) for an absolute name, without importlib."""
    __import__(name)
    return sys.modules[name]


def _load_callable(run_args):
    """Step 2: returns the callable to run. Raises _ImportFailure."""
    module_name = run_args.get("module") or ""
    function_name = run_args.get("function") or ""
    class_name = run_args.get("class_name") or ""
    if not module_name:
        raise _ImportFailure("no module given in runner arguments")
    if module_name in _PRELOAD_FAILURES:
        raise _ImportFailure(_PRELOAD_FAILURES[module_name])
    try:
        module = _import_module(module_name)
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
    if not isinstance(cls, type):
        raise _ImportFailure("%s.%s is not a class" % (module_name, class_name))
    try:
        kwargs = {}
        if _constructor_takes_tool_config(cls):
            kwargs["tool_config"] = dict(run_args.get("tool_config") or {})
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


def _constructor_takes_tool_config(cls):
    """True when cls(...) has a parameter named tool_config.

    A plain class (metaclass type, no __new__ of its own, no __signature__)
    is answered from its __init__'s code; anything else asks inspect.
    """
    init = cls.__init__
    if (
        type(cls) is type
        and cls.__new__ is object.__new__
        and not hasattr(cls, "__signature__")
        and not hasattr(cls, "__wrapped__")
    ):
        if init is object.__init__:
            return False
        if _is_plain_function(init):
            try:
                return any(p[0] == "tool_config" for p in _code_parameters(init)[1:])
            except Exception:  # an annotation that fails to evaluate (PEP 649)
                pass
    import inspect

    try:
        return "tool_config" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------
# Calling convention (spec section 8)
#
# A parameter is a tuple (name, kind, annotation, has_default); kind uses
# the numbering of inspect.Parameter.kind, annotation is _NO_ANNOTATION
# when there is none.

POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL, KEYWORD_ONLY, VAR_KEYWORD = range(5)
_POSITIONAL_KINDS = (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD)
_VARIADIC_KINDS = (VAR_POSITIONAL, VAR_KEYWORD)

# Code object flags (Include/cpython/code.h, stable since Python 3.5).
CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08
CO_COROUTINE = 0x80
CO_ITERABLE_COROUTINE = 0x100


class _NoAnnotation:
    def __repr__(self):
        return "<no annotation>"


_NO_ANNOTATION = _NoAnnotation()


def _function_type_probe():
    pass


class _MethodTypeProbe:
    def method(self):
        pass


_FunctionType = type(_function_type_probe)
_MethodType = type(_MethodTypeProbe().method)

# Function attributes that change what inspect.signature reports (a
# decorator's __wrapped__, an explicit __signature__, partialmethod).
_SIGNATURE_OVERRIDES = ("__wrapped__", "__signature__", "_partialmethod")


def _is_plain_function(fn):
    """True for a def/lambda function whose code is its signature."""
    if type(fn) is not _FunctionType:
        return False
    attrs = fn.__dict__
    return not any(name in attrs for name in _SIGNATURE_OVERRIDES)


def _code_parameters(fn):
    """The parameters of a plain function, read from its code object.

    Order and kinds are those of inspect.signature: positional-only,
    positional-or-keyword, *args, keyword-only, **kwargs.
    """
    code = fn.__code__
    names = code.co_varnames
    n_positional = code.co_argcount
    n_positional_only = code.co_posonlyargcount
    n_keyword_only = code.co_kwonlyargcount
    annotations = fn.__annotations__ or {}
    n_defaults = len(fn.__defaults__ or ())
    keyword_defaults = fn.__kwdefaults__ or {}
    params = []
    for i in range(n_positional):
        name = names[i]
        kind = POSITIONAL_ONLY if i < n_positional_only else POSITIONAL_OR_KEYWORD
        params.append((name, kind, annotations.get(name, _NO_ANNOTATION), i >= n_positional - n_defaults))
    next_name = n_positional + n_keyword_only
    if code.co_flags & CO_VARARGS:
        name = names[next_name]
        params.append((name, VAR_POSITIONAL, annotations.get(name, _NO_ANNOTATION), False))
        next_name += 1
    for i in range(n_positional, n_positional + n_keyword_only):
        name = names[i]
        params.append((name, KEYWORD_ONLY, annotations.get(name, _NO_ANNOTATION), name in keyword_defaults))
    if code.co_flags & CO_VARKEYWORDS:
        name = names[next_name]
        params.append((name, VAR_KEYWORD, annotations.get(name, _NO_ANNOTATION), False))
    return params


class _Convention:
    """What the runner knows about how to call fn.

    params is the parameter list (None when no signature can be had, as
    for some builtins); is_coroutine is True for an "async def" function
    or method.
    """

    __slots__ = ("params", "is_coroutine")

    def __init__(self, params, is_coroutine):
        self.params = params
        self.is_coroutine = is_coroutine


def _convention(fn):
    """Step 3a: fn's parameters, from its code object when it is a plain
    function or a method of one (self skipped), else from inspect."""
    func, skip = fn, 0
    if type(fn) is _MethodType:
        func, skip = fn.__func__, 1
    if _is_plain_function(func):
        try:
            params = _code_parameters(func)
        except Exception:  # an annotation that fails to evaluate (PEP 649)
            params = None
        if params is not None and (not skip or (params and params[0][1] in _POSITIONAL_KINDS)):
            return _Convention(params[skip:], bool(func.__code__.co_flags & CO_COROUTINE))
    # Callable instances, functools.partial, decorated functions, builtins:
    # unusual enough to pay for inspect.
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return _Convention(None, False)
    params = [
        (
            p.name,
            int(p.kind),
            _NO_ANNOTATION if p.annotation is inspect.Parameter.empty else p.annotation,
            p.default is not inspect.Parameter.empty,
        )
        for p in sig.parameters.values()
    ]
    return _Convention(params, inspect.iscoroutinefunction(fn))


def _annotation_name(annotation):
    """The last dotted part of a string annotation ("typing.Any" -> "Any")."""
    return annotation.strip().strip("'\"").rsplit(".", 1)[-1]


def _is_facade_annotation(annotation):
    if annotation is _NO_ANNOTATION:
        return False
    if annotation is ToolContext:
        return True
    if isinstance(annotation, str):
        return _annotation_name(annotation) in FACADE_ANNOTATION_NAMES
    if isinstance(annotation, type):
        return annotation.__name__ == "ToolContextFacade"
    return False


def _is_any_annotation(annotation):
    """typing.Any (or typing_extensions.Any), object, or a string naming one."""
    if annotation is object:
        return True
    if isinstance(annotation, str):
        return _annotation_name(annotation) in ANY_ANNOTATION_NAMES
    # A tool that wrote typing.Any has imported typing already.
    for module_name in ("typing", "typing_extensions"):
        module = sys.modules.get(module_name)
        if module is not None and annotation is getattr(module, "Any", None):
            return True
    return False


def _takes_context_first(param, args, artifact_params):
    """The first-parameter rule (module docstring, spec section 8)."""
    name, kind, annotation, _ = param
    return (
        kind in _POSITIONAL_KINDS
        and name not in args
        and name not in artifact_params
        and name != "tool_config"
        and (
            annotation is _NO_ANNOTATION
            or _is_any_annotation(annotation)
            or _is_facade_annotation(annotation)
        )
    )


def _build_call(fn, convention, ctx, args, tool_config):
    """Step 3b: returns (positional, keyword) arguments for fn.

    The first parameter receives ctx positionally when _takes_context_first
    says so; the args go as keyword arguments. A parameter not among the
    args named tool_config receives the tool config, one annotated as the
    context facade (ToolContextFacade or ToolContext, as a class or a
    string) receives ctx, and one naming an input artifact receives its
    local path (see the module docstring). Raises TypeError when the
    result would not bind to fn's parameters.
    """
    params = convention.params
    if params is None:
        # No signature available (some builtins): args as keywords alone.
        return [], dict(args)
    positional = []
    kwargs = dict(args)
    rest = params
    artifact_params = _artifact_params(ctx.list_artifacts())
    if params and _takes_context_first(params[0], args, artifact_params):
        positional.append(ctx)
        rest = params[1:]
    for name, kind, annotation, _ in rest:
        if kind in _VARIADIC_KINDS or name in args:
            continue
        if name == "tool_config":
            kwargs["tool_config"] = tool_config
        elif _is_facade_annotation(annotation):
            kwargs[name] = ctx
        elif name in artifact_params:
            kwargs[name] = artifact_params[name]
    if not _binds(params, len(positional), kwargs):
        _raise_bind_error(fn, positional, kwargs)
    return positional, kwargs


def _binds(params, n_positional, kwargs):
    """True when n_positional values and kwargs bind to params, by the
    rules of Signature.bind (and of the call itself)."""
    positional_params = [p for p in params if p[1] in _POSITIONAL_KINDS]
    kinds = {p[1] for p in params}
    if n_positional > len(positional_params) and VAR_POSITIONAL not in kinds:
        return False
    bound = {p[0] for p in positional_params[:n_positional]}
    keyword_names = {p[0] for p in params if p[1] in (POSITIONAL_OR_KEYWORD, KEYWORD_ONLY)}
    for name in kwargs:
        if name in bound:
            return False  # multiple values for one parameter
        if name not in keyword_names and VAR_KEYWORD not in kinds:
            return False  # unexpected, or positional-only given by keyword
    for name, kind, _, has_default in params:
        if has_default or kind in _VARIADIC_KINDS or name in bound:
            continue
        if kind == POSITIONAL_ONLY or name not in kwargs:
            return False  # a required parameter is missing
    return True


def _raise_bind_error(fn, positional, kwargs):
    """Raises the TypeError inspect's Signature.bind gives for this call
    (imported here: a mismatch is rare and its message is worth the cost)."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise TypeError("arguments do not match the tool's signature: %s" % e)
    try:
        sig.bind(*positional, **kwargs)
    except TypeError as e:
        raise TypeError("arguments do not match the tool's signature %s: %s" % (sig, e))
    # inspect accepts what _binds refused: let the call itself decide.


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


def _generator_type_probe():
    yield


_GeneratorType = type(_generator_type_probe())


def _is_awaitable(value):
    """inspect.isawaitable without inspect."""
    if getattr(type(value), "__await__", None) is not None:
        return True  # coroutines, futures, anything with __await__
    # a generator-based coroutine (@types.coroutine)
    return isinstance(value, _GeneratorType) and bool(value.gi_code.co_flags & CO_ITERABLE_COROUTINE)


def _run_tool(fn, convention, positional, kwargs):
    """Step 4: calls fn; runs a coroutine to completion."""
    result = fn(*positional, **kwargs)
    if convention.is_coroutine or _is_awaitable(result):
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
        return value if value - value == 0.0 else str(value)  # not inf, not nan
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
            _json_dumps(value)
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
        import traceback

        lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        tail = lines.rstrip("\n").split("\n")[-TRACEBACK_TAIL_LINES:]
        text += "\n" + "\n".join(tail)
    return text


def _is_tool_error(exc):
    return any(klass.__name__ == "ToolError" for klass in type(exc).__mro__)


def _write_result(path, document):
    """Step 6: writes document to path atomically (temp, rename).

    No fsync: the worker reads the file on this host right after the done
    signal, and a host crash loses the call anyway (it is answered by no
    one); an fsync cost 1-3 ms of the call on ext4.
    """
    data = _json_dumps(document).encode("utf-8")
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, ".%s.tmp.%d" % (os.path.basename(path), os.getpid()))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _error(text, kind):
    return {"error": text, "error_kind": kind}


USAGE = (
    "usage: runner.py [--done-fd N] RUNNER_ARGS_JSON\n"
    "       runner.py [--done-fd N] --warm ARGS_FD MODULE FUNCTION [CLASS_NAME]\n"
)

# Bytes written on the done descriptor (--done-fd).
SIGNAL_READY = b"r"  # warm mode: imports done, waiting for the arguments
SIGNAL_DONE = b"d"  # the result file is complete (written and renamed)


def _parse_argv(argv):
    """Returns (done_fd, warm, rest) or raises ValueError."""
    args = list(argv[1:])
    done_fd = None
    warm = False
    while args and args[0].startswith("--"):
        opt = args.pop(0)
        if opt == "--done-fd" and args:
            done_fd = int(args.pop(0))
        elif opt == "--warm":
            warm = True
        else:
            raise ValueError("unknown option %s" % opt)
    if warm and not 3 <= len(args) <= 4:
        raise ValueError("--warm takes ARGS_FD MODULE FUNCTION [CLASS_NAME]")
    if not warm and len(args) != 1:
        raise ValueError("one RUNNER_ARGS_JSON expected")
    return done_fd, warm, args


def _claim_fd(fd):
    """fd if it is an open pipe (then no longer inherited by the tool's
    children), else None: a missing descriptor is never written to."""
    if fd is None:
        return None
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        os.set_inheritable(fd, False)
    except (OSError, ValueError, OverflowError):
        return None
    return fd


def _signal(fd, what):
    """Writes one signal byte on fd; the worker may be gone (ignored)."""
    if fd is None:
        return
    try:
        os.write(fd, what)
    except OSError:
        pass


def _read_fd(fd):
    """Everything on fd up to EOF (the worker closes its end after the
    arguments), then closes fd."""
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


# Import failures of warm mode's early import, by module name: the call
# reports them exactly as a cold run's import would (module code is not
# run a second time).
_PRELOAD_FAILURES = {}


def _preload(module_name, function_name, class_name):
    """Warm mode: everything a call needs that does not depend on its
    arguments, done before they arrive: the str_tool facade, the tool's
    module, asyncio for a coroutine tool, the modules the runner imports
    lazily (unicodedata for filenames, traceback for errors)."""
    _register_facade_module()
    try:
        module = _import_module(module_name)
    except BaseException as e:  # module code may raise anything, even SystemExit
        _PRELOAD_FAILURES[module_name] = "cannot import module %r: %s" % (
            module_name,
            _describe(e, with_traceback=True),
        )
        module = None
    if module is not None and function_name and not class_name:
        fn = getattr(module, function_name, None)
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if code is not None and code.co_flags & CO_COROUTINE:
            import asyncio  # noqa: F401 - ~35 ms, now off the request path
    import traceback  # noqa: F401
    import unicodedata  # noqa: F401


def main(argv):
    # The done descriptor first, before this process opens anything that
    # could take its number.
    try:
        done_fd, warm, rest = _parse_argv(argv)
    except ValueError as e:
        sys.stderr.write("str runner: %s\n%s" % (e, USAGE))
        return EXIT_NO_RESULT
    done_fd = _claim_fd(done_fd)

    # The runner's own directory must not shadow tool modules.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]

    # 0. warm mode: prepare, say so, wait for the arguments.
    if warm:
        source = "descriptor %s" % rest[0]
        _preload(rest[1], rest[2], rest[3] if len(rest) > 3 else "")
        _signal(done_fd, SIGNAL_READY)
        try:
            data = _read_fd(int(rest[0]))
        except (OSError, ValueError) as e:
            sys.stderr.write("str runner: cannot read the arguments on %s: %s\n" % (source, e))
            return EXIT_NO_RESULT
    else:
        source = rest[0]
        data = None

    # 1. read the arguments
    try:
        if data is None:
            with open(source, "rb") as f:
                data = f.read()
        run_args = _json_loads(data.decode("utf-8"))
        if not isinstance(run_args, dict):
            raise ValueError("runner arguments are not a JSON object")
        result_file = run_args.get("result_file")
        if not isinstance(result_file, str) or not result_file:
            raise ValueError("runner arguments have no result_file")
    except Exception as e:
        sys.stderr.write("str runner: cannot read %s: %s\n" % (source, e))
        return EXIT_NO_RESULT

    document = _run(run_args)

    try:
        _write_result(result_file, document)
    except Exception as e:
        sys.stderr.write("str runner: cannot write result %s: %s\n" % (result_file, e))
        return EXIT_NO_RESULT
    # The result is complete: the worker may answer now, before this
    # process and its sandbox are gone.
    _signal(done_fd, SIGNAL_DONE)
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
        convention = _convention(fn)
        positional, kwargs = _build_call(fn, convention, ctx, args, tool_config)
    except TypeError as e:
        return _error("TypeError: %s" % e, "execution")

    # 4. run
    try:
        value = _run_tool(fn, convention, positional, kwargs)
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
    mod = type(sys)("str_tool")  # types.ModuleType, without importing types
    mod.__doc__ = "Names a str tool may import while running under the str runner."
    mod.ToolError = ToolError
    mod.ToolContext = ToolContext
    mod.ToolContextFacade = ToolContext
    sys.modules.setdefault("str_tool", mod)


def entry(argv):
    """Runs main(argv) and returns the process's exit status."""
    try:
        return main(argv)
    except SystemExit:
        raise
    except BaseException as e:  # a runner bug: never leave silently
        sys.stderr.write("str runner: internal error: %s\n" % _describe(e, with_traceback=True))
        return EXIT_NO_RESULT


if __name__ == "__main__":
    sys.exit(entry(sys.argv))
