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
     find the function, or instantiate class_name (class-based tools,
     below); any failure here is reported with error_kind "import";
  3. build the context object (ctx) and the call arguments following the
     calling convention (below);
  4. call the tool (an "async def" tool, or any awaitable it returns, runs
     under asyncio.run);
     an exception is reported with error_kind "execution", an exception
     whose class (or a base class) is named ToolError with error_kind "tool";
  5. write the data objects of a ToolResult that are to become artifacts
     into output_dir, and normalise the return value to a JSON object
     (spec section 3; portable tools, below);
  6. write result_file atomically (temporary file, rename) as
     {"result": {...}} or {"error": "...", "error_kind": "..."}.

Init mode ("mode": "init" in runner_args.json, or the reference's
"init_mode": true) describes the tool instead of calling it, for the init
sub-protocol (spec section 14): the result is the tool's InitInfo
(tool_name, description, parameters_schema in the agent's Schema dialect,
ctx_facade_param_name, artifact_params; absent ones left out). A
class-based tool is instantiated as for a call, its init(component=None,
tool_config=...) awaited, its tool_name, tool_description,
parameters_schema, ctx_facade_param_name and artifact_params read, and its
cleanup() awaited, as the reference's init does. A function tool is
described from its signature and docstring as the reference's agent
describes a function it wraps (see _describe_function).

Done signal (--done-fd N, a pipe from the worker): after the result file
is complete (step 6) the runner writes one byte "d" on it, so the worker
can answer before this process and its sandbox are gone. The byte is only
a hint: the worker reads result.json itself, and a missing or early byte
(a tool can write on the descriptor too) makes it wait for the exit.

Warm mode (--warm ARGS_FD MODULE FUNCTION [CLASS_NAME]), for the worker's
pool of pre-started sandboxes: the runner first does everything that does
not depend on the call (registers str_tool, imports MODULE, and asyncio
when FUNCTION is a coroutine function), writes "r" on the done
descriptor, then reads the runner arguments as JSON from ARGS_FD up to
EOF and goes on exactly as a cold run from step 1 (an import failure of
MODULE is reported then, as step 2 would; the module is not imported
twice). Each warm runner serves one call.

Interpreter start (-S): the worker starts the runner with "python3 -S",
so Python's site module does not run at start: no .pth file of the
interpreter's site-packages is executed (on a host with .pth hooks that
import packages, e.g. certifi patches, ~3-5 ms of every call), no
sitecustomize or usercustomize, no user site dir. The runner then puts
exactly what the tools may import on sys.path itself (_site_paths): the
interpreter's own site-packages dirs that exist in the sandbox, after the
standard library, in site's order, as site would have (the tools dir and a
declared package's site dir come first, from PYTHONPATH); and it defines
the builtins site defines (exit, quit, help, copyright, credits, license).
A system package that needs its .pth file to import (a legacy namespace
package's -nspkg.pth) is not importable so. An interpreter in a virtual
environment (pyvenv.cfg beside it) gets site's own processing instead,
.pth files included. Without -S (the runner run by hand, or by tests)
nothing changes.

Exit status: 0 when a result file was written (even one carrying an error),
2 when no result file could be written (unreadable arguments, unwritable
result path). Nothing the tool prints on stdout or stderr is interpreted.

Calling convention (spec section 8): the first parameter receives ctx
when it is positional, not among the args, not an input artifact
parameter, not named tool_config, and either unannotated or annotated
Any (typing.Any, "Any", object) or with a context type (below); the args
go as keyword arguments. So both generations of reference tools,
"def f(ctx, x)" and "def f(ctx: Any, x)", get ctx, and a plain
"def hello(name: str)" gets its args alone. Any other parameter not among
the args receives the tool config when it is named tool_config, a context
when it is annotated with a context type, and an input artifact as below.
Strings (from "from __future__ import annotations") count like the names
they spell, by their last dotted part ("typing.Any" is Any).

Context types: a parameter annotated ToolContextFacade (the reference's
rule: a class of that name or SandboxToolContextFacade, a string
containing the name, or Optional of one) receives the portable facade
(ToolContextFacade below: the reference's API, with async
load_artifact(filename)); one annotated ToolContext, and an unannotated or
Any first parameter, receive the legacy ctx (ToolContext: spec section 8's
load_artifact(param) and friends).

Input artifacts: a tool parameter that is not among the args but names an
input artifact (a key of artifact_paths) receives the artifact's local path;
a list-valued artifact parameter ("p[0]", "p[1]", ...) receives the list of
paths. The bytes are read with ctx.load_artifact(param) as usual.

Portable tools (the reference's newer API): a parameter annotated
Artifact, List[Artifact], Optional[Artifact] (or their string forms)
receives Artifact objects (content, filename, version, mime_type,
metadata, as_text(), as_bytes()) built from artifact_metadata in place
of the filenames the agent sent, as the reference's runner builds them
(a list from the entries "p[0]", "p[1]", ... of the filenames sent; an
entry or file that is missing is skipped). A return value with
model_dump and data_objects (a ToolResult) has each data object whose
disposition is auto, artifact or artifact_with_preview written into
output_dir under its name (ctx.save_artifact's checks; the worker then
saves it with the other output files) and removed from data_objects; the
result is its model_dump(), with what JSON cannot hold as its str() (the
reference's json.dumps(default=str)).

Class-based tools: when class_name is set, a class of the reference's
DynamicTool shape (it has _run_async_impl) is run as the reference runs
it: instantiated with tool_config=<config_model.model_validate(tool
config)> when the class has a config_model, else tool_config=<the tool
config>; called as _run_async_impl(args=<the args, plus Artifact objects
for its artifact_params and the facade under its ctx_facade_param_name>,
tool_context=None), awaited when it returns an awaitable; "function" is
ignored. Any other class (str's older convention) is instantiated with
tool_config=... when its constructor has that parameter, else with no
arguments; the method called is the attribute named by "function", or,
when "function" is empty, the instance's __call__ (if the class defines
one) and then its "run".

The reference's own types: a tool that imports ToolResult, DataObject,
DataDisposition, Artifact, DynamicTool or ToolContextFacade from
solace_agent_mesh gets the real package when it is importable in the
sandbox. Otherwise a meta path finder, consulted after every other one,
serves stand-ins under the same module names (_SHIM_MODULES): same
constructors, attributes and model_dump() output, no pydantic. As the
reference's sandbox does, the runner sets _SAM_SANDBOX_LIGHT=1 (unless
set) so that the real package skips importing its heavy built-in tools.

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

# Annotation names that mark a parameter as "receives the context object":
# a name containing ToolContextFacade gets the portable facade (the
# reference's rule, so SandboxToolContextFacade counts), ToolContext the
# legacy ctx.
FACADE_ANNOTATION_NAME = "ToolContextFacade"
LEGACY_CONTEXT_ANNOTATION_NAME = "ToolContext"
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


# Bidirectional overrides and isolates, zero-width characters: a name
# holding one displays as another (the worker's rule: invisibleRune).
_INVISIBLE = frozenset(
    [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)]
    + ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]
)


def _unsafe_filename_reason(filename):
    """Returns why filename is not a safe output name, or None if it is.

    The rule is the worker's (Go: worker/artifacts CheckFilename), so a
    name the runner accepts is one the worker stores: valid UTF-8; after
    an optional "user:" prefix, and again after NFKC normalisation, not
    empty, not "." or "..", not absolute, no "/" or "\\", no control
    character (Unicode category Cc), no bidirectional or zero-width
    character, at most 255 bytes. unicodedata is
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
        if any(c in _INVISIBLE for c in rest):
            return "filename %r contains a bidirectional or zero-width character" % filename
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

    def _portable_facade(self):
        """The run's ToolContextFacade (one per run, made on first use)."""
        facade = self.__dict__.get("_facade")
        if facade is None:
            facade = self._facade = ToolContextFacade(self)
        return facade


class ToolContextFacade:
    """The context of portable tools (the reference's ToolContextFacade API).

    A parameter annotated ToolContextFacade (and a class-based tool's
    ctx_facade_param_name) receives this object instead of the legacy ctx:
    the same tool code runs in-process under an agent and here. Artifacts
    are addressed by filename and loaded asynchronously, as the agent's
    facade does; status, output artifacts and configuration go through the
    run's ToolContext, so both objects share one output directory and one
    record of mime types.
    """

    ToolError = ToolError

    def __init__(self, ctx):
        self._ctx = ctx
        self._state = {}
        # {filename: {local_path, mime_type, version}} of the input artifacts.
        self._artifacts = {}
        for meta in ctx._artifact_metadata.values():
            if isinstance(meta, dict) and meta.get("filename"):
                self._artifacts[meta["filename"]] = {
                    "local_path": meta.get("local_path") or "",
                    "mime_type": meta.get("mime_type") or "application/octet-stream",
                    "version": meta.get("version", 0),
                }

    user_id = property(lambda self: self._ctx.user_id)
    session_id = property(lambda self: self._ctx.session_id)
    app_name = property(lambda self: self._ctx.app_name)
    state = property(lambda self: self._state)
    # The agent's ADK ToolContext does not exist inside a sandbox.
    raw_tool_context = property(lambda self: None)

    def get_config(self, key, default=None):
        return self._ctx.get_config(key, default)

    def send_status(self, message):
        return self._ctx.send_status(message)

    def send_signal(self, signal_data, skip_buffer_flush=False):
        """Not available in a sandbox (only text status lines are relayed)."""
        return False

    def _artifact(self, filename):
        info = self._artifacts.get(filename)
        if not info:
            raise FileNotFoundError("Artifact %r not found in preloaded artifacts" % filename)
        return info

    async def load_artifact(self, filename, version="latest", as_text=False):
        """The bytes (as_text: UTF-8 text) of the input artifact filename;
        version is ignored (only the version the worker loaded is here)."""
        info = self._artifact(filename)
        try:
            with open(info["local_path"], "rb") as f:
                content = f.read()
        except FileNotFoundError:
            raise
        except OSError as e:
            raise ValueError("Failed to read artifact %r: %s" % (filename, e)) from e
        return content.decode("utf-8") if as_text else content

    async def load_artifact_metadata(self, filename, version="latest"):
        info = self._artifact(filename)
        try:
            size = os.stat(info["local_path"]).st_size
        except OSError:
            size = 0
        return {"mime_type": info["mime_type"], "size_bytes": size, "version": info["version"]}

    async def list_artifacts(self):
        return list(self._artifacts)

    async def artifact_exists(self, filename):
        return filename in self._artifacts

    # The sandbox-only methods the reference's facade keeps for older tools.

    def load_artifact_by_param(self, param_name):
        return self._ctx.load_artifact(param_name)

    def save_artifact(self, filename, content, mime_type=None):
        return self._ctx.save_artifact(filename, content, mime_type)

    def save_artifact_text(self, filename, content, encoding="utf-8", mime_type=None):
        return self._ctx.save_artifact(filename, str(content).encode(encoding), mime_type)

    def list_output_artifacts(self):
        return self._ctx.list_output_artifacts()

    def __repr__(self):
        return "ToolContextFacade(app=%s, user=%s, session=%s)" % (
            self.app_name,
            self.user_id,
            self.session_id,
        )


# --------------------------------------------------------------------------
# The reference's portable types, for tools that import them where the
# reference's package (solace_agent_mesh) is not installed
#
# Portable tools import ToolResult and DataObject, Artifact, DynamicTool and
# ToolContextFacade from solace_agent_mesh. When that package is importable
# the tool gets the real one (the finder below is consulted only after every
# other finder failed, and serves a submodule only under its own stand-in
# package). Otherwise it gets these stand-ins, written from the reference's
# documented behaviour: same names, constructors, attributes and
# model_dump() output, without pydantic.


class Artifact:
    """An input artifact handed to a parameter annotated Artifact."""

    __slots__ = ("content", "filename", "version", "mime_type", "metadata")

    def __init__(self, content, filename, version, mime_type, metadata=None):
        self.content = content
        self.filename = filename
        self.version = version
        self.mime_type = mime_type
        self.metadata = {} if metadata is None else metadata

    def as_text(self, encoding="utf-8"):
        if isinstance(self.content, bytes):
            return self.content.decode(encoding)
        return self.content

    def as_bytes(self, encoding="utf-8"):
        if isinstance(self.content, str):
            return self.content.encode(encoding)
        return self.content

    def _fields(self):
        return (self.content, self.filename, self.version, self.mime_type, self.metadata)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None

    def __repr__(self):
        return "Artifact(content=%r, filename=%r, version=%r, mime_type=%r, metadata=%r)" % self._fields()


class ArtifactTypeInfo:
    """What an Artifact annotation asks for (artifact_types.get_artifact_info)."""

    __slots__ = ("is_artifact", "is_list", "is_optional")

    def __init__(self, is_artifact=False, is_list=False, is_optional=False):
        self.is_artifact = is_artifact
        self.is_list = is_list
        self.is_optional = is_optional

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return (self.is_artifact, self.is_list, self.is_optional) == (
            other.is_artifact,
            other.is_list,
            other.is_optional,
        )

    __hash__ = None

    def __repr__(self):
        return "ArtifactTypeInfo(is_artifact=%s, is_list=%s, is_optional=%s)" % (
            self.is_artifact,
            self.is_list,
            self.is_optional,
        )


def _get_artifact_info(annotation):
    info = _artifact_info(_NO_ANNOTATION if annotation is None else annotation)
    if info is None:
        return ArtifactTypeInfo()
    return ArtifactTypeInfo(is_artifact=True, is_list=info[0], is_optional=info[1])


def _build_artifact_types(mod):
    mod.Artifact = Artifact
    mod.ArtifactTypeInfo = ArtifactTypeInfo
    mod.get_artifact_info = _get_artifact_info
    mod.is_artifact_type = lambda annotation: _get_artifact_info(annotation).is_artifact


_DATA_OBJECT_FIELDS = ("name", "content", "mime_type", "disposition", "description", "preview", "metadata", "tags")
_TOOL_RESULT_FIELDS = ("status", "message", "data", "data_objects", "error_code")


def _build_tool_result(mod):
    """tool_result: DataDisposition, DataObject, ToolResult (enum is
    imported here, only by tools that use them)."""
    import base64
    import enum

    class DataDisposition(str, enum.Enum):
        AUTO = "auto"
        ARTIFACT = "artifact"
        INLINE = "inline"
        ARTIFACT_WITH_PREVIEW = "artifact_with_preview"

    def check(owner, field, value, types, optional):
        if value is None and optional:
            return None
        if not isinstance(value, types):
            raise ValueError(
                "%s.%s: %s is not a valid value" % (owner, field, type(value).__name__)
            )
        return value

    class _Model:
        """Equality and repr by the model's fields, as pydantic gives them."""

        _fields = ()

        def __eq__(self, other):
            if type(other) is not type(self):
                return NotImplemented
            return self.model_dump() == other.model_dump()

        __hash__ = None

        def __repr__(self):
            return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (f, getattr(self, f)) for f in self._fields))

    class DataObject(_Model):
        """A piece of tool output, inline or saved as an artifact."""

        _fields = _DATA_OBJECT_FIELDS

        def __init__(self, *, name, content, mime_type="text/plain", disposition=DataDisposition.AUTO,
                     description=None, preview=None, metadata=None, tags=None):
            self.name = check("DataObject", "name", name, str, False)
            if isinstance(content, (bytearray, memoryview)):
                content = bytes(content)
            self.content = check("DataObject", "content", content, (str, bytes), False)
            self.mime_type = check("DataObject", "mime_type", mime_type, str, False)
            # use_enum_values: the value, as the reference's model stores it
            self.disposition = DataDisposition(disposition).value
            self.description = check("DataObject", "description", description, str, True)
            self.preview = check("DataObject", "preview", preview, str, True)
            self.metadata = check("DataObject", "metadata", metadata, dict, True)
            self.tags = None if tags is None else list(tags)

        def model_dump(self):
            return {field: getattr(self, field) for field in _DATA_OBJECT_FIELDS}

        def to_serializable(self):
            content, is_binary = self.content, isinstance(self.content, bytes)
            if is_binary:
                content = base64.b64encode(content).decode("utf-8")
            return {
                "name": self.name,
                "content": content,
                "is_binary": is_binary,
                "mime_type": self.mime_type,
                "disposition": self.disposition,
                "description": self.description,
                "preview": self.preview,
                "metadata": self.metadata,
            }

        @classmethod
        def from_serialized(cls, data):
            content = data.get("content", "")
            if data.get("is_binary", False):
                content = base64.b64decode(content)
            return cls(
                name=data["name"],
                content=content,
                mime_type=data.get("mime_type", "text/plain"),
                disposition=DataDisposition(data.get("disposition", "auto")),
                description=data.get("description"),
                preview=data.get("preview"),
                metadata=data.get("metadata"),
            )


    class ToolResult(_Model):
        """A tool's structured result: status, message, inline data, data objects."""

        _fields = _TOOL_RESULT_FIELDS

        def __init__(self, *, status="success", message=None, data=None, data_objects=None, error_code=None):
            self.status = check("ToolResult", "status", status, str, False)
            self.message = check("ToolResult", "message", message, str, True)
            self.data = check("ToolResult", "data", data, dict, True)
            objects = []
            for item in data_objects or ():
                if isinstance(item, dict):
                    item = DataObject(**item)
                objects.append(check("ToolResult", "data_objects", item, DataObject, False))
            self.data_objects = objects
            self.error_code = check("ToolResult", "error_code", error_code, str, True)

        @classmethod
        def ok(cls, message, data=None, data_objects=None):
            return cls(status="success", message=message, data=data, data_objects=data_objects or [])

        @classmethod
        def error(cls, message, code=None, data=None):
            return cls(status="error", message=message, error_code=code, data=data)

        @classmethod
        def partial(cls, message, data=None, data_objects=None, error_code=None):
            return cls(status="partial", message=message, data=data, data_objects=data_objects or [],
                       error_code=error_code)

        def model_dump(self):
            out = {field: getattr(self, field) for field in _TOOL_RESULT_FIELDS}
            out["data_objects"] = [obj.model_dump() for obj in self.data_objects]
            return out

        def to_serializable(self):
            return {
                "_schema": "ToolResult",
                "_schema_version": mod.TOOL_RESULT_SCHEMA_VERSION,
                "status": self.status,
                "message": self.message,
                "data": self.data,
                "data_objects": [obj.to_serializable() for obj in self.data_objects],
                "error_code": self.error_code,
            }

        @classmethod
        def from_serialized(cls, data):
            if data.get("_schema") != "ToolResult":
                raise ValueError(
                    "Invalid schema marker: expected 'ToolResult', got '%s'" % data.get("_schema")
                )
            objects = []
            for item in data.get("data_objects", []):
                try:
                    objects.append(DataObject.from_serialized(item))
                except Exception:
                    pass
            return cls(status=data.get("status", "success"), message=data.get("message"),
                       data=data.get("data"), data_objects=objects, error_code=data.get("error_code"))

        @staticmethod
        def is_serialized_tool_result(data):
            return isinstance(data, dict) and data.get("_schema") == "ToolResult"


    for cls in (DataDisposition, DataObject, ToolResult):
        cls.__module__ = mod.__name__
    mod.TOOL_RESULT_SCHEMA_VERSION = "1.0"
    mod.DataDisposition = DataDisposition
    mod.DataObject = DataObject
    mod.ToolResult = ToolResult


def _build_dynamic_tool(mod):
    """dynamic_tool: DynamicTool, the base of class-based tools (without
    the agent's ADK BaseTool; the runner calls _run_async_impl directly)."""
    import abc

    class DynamicTool(abc.ABC):
        config_model = None

        def __init__(self, tool_config=None):
            self.name = "dynamic_tool_placeholder"
            self.description = "dynamic_tool_placeholder"
            self.tool_config = tool_config or {}

        async def init(self, component, tool_config):
            pass

        async def cleanup(self, component, tool_config):
            pass

        @property
        @abc.abstractmethod
        def tool_name(self):
            pass

        @property
        @abc.abstractmethod
        def tool_description(self):
            pass

        @property
        @abc.abstractmethod
        def parameters_schema(self):
            pass

        @property
        def raw_string_args(self):
            return []

        @property
        def resolution_type(self):
            return "early"

        @property
        def artifact_args(self):
            return []

        @property
        def artifact_params(self):
            return {name: ArtifactTypeInfo(is_artifact=True) for name in self.artifact_args}

        @property
        def ctx_facade_param_name(self):
            return None

        async def run_async(self, *, args, tool_context):
            return await self._run_async_impl(args=dict(args), tool_context=tool_context, credential=None)

        @abc.abstractmethod
        async def _run_async_impl(self, args, tool_context, credential=None):
            pass

    DynamicTool.__module__ = mod.__name__
    mod.DynamicTool = DynamicTool


def _build_tools_package(mod):
    """solace_agent_mesh.agent.tools re-exports what the reference's does."""
    for sub in ("tool_result", "artifact_types", "dynamic_tool"):
        __import__(mod.__name__ + "." + sub)
    tool_result = sys.modules[mod.__name__ + ".tool_result"]
    for name in ("ToolResult", "DataObject", "DataDisposition"):
        setattr(mod, name, getattr(tool_result, name))
    mod.Artifact = Artifact
    mod.ArtifactTypeInfo = ArtifactTypeInfo
    mod.get_artifact_info = _get_artifact_info


def _build_facade_module(mod):
    mod.ToolContextFacade = ToolContextFacade


def _build_sandbox_facade_module(mod):
    mod.SandboxToolContextFacade = ToolContextFacade


_SHIM_ROOT = "solace_agent_mesh"
# Module name -> (is a package, builder or None).
_SHIM_MODULES = {
    _SHIM_ROOT: (True, None),
    _SHIM_ROOT + ".agent": (True, None),
    _SHIM_ROOT + ".agent.tools": (True, _build_tools_package),
    _SHIM_ROOT + ".agent.tools.tool_result": (False, _build_tool_result),
    _SHIM_ROOT + ".agent.tools.artifact_types": (False, _build_artifact_types),
    _SHIM_ROOT + ".agent.tools.dynamic_tool": (False, _build_dynamic_tool),
    _SHIM_ROOT + ".agent.utils": (True, None),
    _SHIM_ROOT + ".agent.utils.tool_context_facade": (False, _build_facade_module),
    _SHIM_ROOT + ".sandbox": (True, None),
    _SHIM_ROOT + ".sandbox.context_facade": (False, _build_sandbox_facade_module),
}
_ModuleSpec = type(sys.__spec__)  # importlib.machinery.ModuleSpec, without importlib


class _ReferenceShimFinder:
    """A meta path finder, last in sys.meta_path, that serves the
    stand-in modules of _SHIM_MODULES: the root only when no other finder
    found a real solace_agent_mesh, a submodule only under the stand-in
    root (a real package keeps all of its own submodules)."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        entry = _SHIM_MODULES.get(name)
        if entry is None:
            return None
        if name != _SHIM_ROOT:
            parent = sys.modules.get(name.rpartition(".")[0])
            if not getattr(parent, "__str_stand_in__", False):
                return None
        return _ModuleSpec(name, cls, is_package=entry[0])

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        is_package, build = _SHIM_MODULES[module.__name__]
        module.__str_stand_in__ = True
        module.__doc__ = "str runner stand-in for the reference's %s (not installed here)." % module.__name__
        if is_package:
            module.__path__ = []
        if build is not None:
            build(module)


def _install_reference_shim():
    """Prepares for tools of the reference: the stand-in finder, and
    _SAM_SANDBOX_LIGHT=1 in the environment, which the reference's
    sandbox sets so that its package, when installed, skips importing its
    heavy built-in tools (about 5 s)."""
    os.environ.setdefault("_SAM_SANDBOX_LIGHT", "1")
    if _ReferenceShimFinder not in sys.meta_path:
        sys.meta_path.append(_ReferenceShimFinder)


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
    instance = _instantiate(module, module_name, class_name, run_args.get("tool_config") or {})
    if _is_dynamic_tool(instance):
        return _DynamicTool(instance)
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


class _DynamicTool:
    """A class-based tool of the reference's DynamicTool shape (it has
    _run_async_impl): called the way the reference's runner calls it."""

    __slots__ = ("instance",)

    def __init__(self, instance):
        self.instance = instance


def _is_dynamic_tool(instance):
    return callable(getattr(instance, "_run_async_impl", None))


def _instantiate(module, module_name, class_name, tool_config):
    """Returns an instance of module.class_name. Raises _ImportFailure.

    A class of the reference's DynamicTool shape (it defines
    _run_async_impl) is built as the reference builds it: with
    tool_config=<config_model.model_validate(tool_config)> when the class
    has a config_model, else tool_config=<the tool config>. Any other class
    gets tool_config=... when its constructor has that parameter, and no
    arguments otherwise (str's own, older convention).
    """
    cls = getattr(module, class_name, None)
    if cls is None:
        raise _ImportFailure("module %r has no attribute %r" % (module_name, class_name))
    if not isinstance(cls, type):
        raise _ImportFailure("%s.%s is not a class" % (module_name, class_name))
    tool_config = dict(tool_config)
    try:
        if callable(getattr(cls, "_run_async_impl", None)):
            config_model = getattr(cls, "config_model", None)
            if config_model:
                return cls(tool_config=config_model.model_validate(tool_config))
            return cls(tool_config=tool_config)
        if _constructor_takes_tool_config(cls):
            return cls(tool_config=tool_config)
        return cls()
    except BaseException as e:
        raise _ImportFailure(
            "cannot instantiate %s.%s: %s" % (module_name, class_name, _describe(e, with_traceback=True))
        )


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


# Kinds of context a parameter annotation asks for (_context_kind).
_FACADE = "facade"
_LEGACY = "legacy"


def _context_kind(annotation):
    """_FACADE for an annotation naming the portable ToolContextFacade
    (a class of that name or SandboxToolContextFacade, a string containing
    the name, or Optional of one), _LEGACY for the str ToolContext, else
    None."""
    if annotation is _NO_ANNOTATION:
        return None
    if annotation is ToolContextFacade:
        return _FACADE
    if annotation is ToolContext:
        return _LEGACY
    if isinstance(annotation, str):
        if FACADE_ANNOTATION_NAME in annotation:
            return _FACADE
        if _annotation_name(annotation) == LEGACY_CONTEXT_ANNOTATION_NAME:
            return _LEGACY
        return None
    for attr in ("__name__", "__qualname__"):
        name = getattr(annotation, attr, None)
        if isinstance(name, str) and name.endswith(FACADE_ANNOTATION_NAME):
            return _FACADE
    origin, members = _generic_parts(annotation)
    if _is_union(annotation, origin):
        inner = [m for m in members if m is not type(None)]
        if len(inner) == 1:
            return _context_kind(inner[0])
    return None


def _is_facade_annotation(annotation):
    return _context_kind(annotation) is not None


def _generic_parts(annotation):
    """(origin, args) of a generic alias such as List[X], list[X],
    Optional[X] or X | None; (None, ()) for anything else. Read from the
    alias's attributes, so typing is not imported for it."""
    if isinstance(annotation, (str, type)) and not hasattr(annotation, "__args__"):
        return None, ()
    try:
        origin = getattr(annotation, "__origin__", None)
        members = getattr(annotation, "__args__", None)
    except Exception:
        return None, ()
    if not isinstance(members, tuple):
        members = ()
    return origin, members


def _is_union(annotation, origin):
    """typing.Union[...] / Optional[...] or a PEP 604 X | Y."""
    typing = sys.modules.get("typing")
    if typing is not None and origin is getattr(typing, "Union", None):
        return True
    return type(annotation).__name__ == "UnionType"


def _names_artifact(annotation):
    """A class named Artifact, the string "Artifact" (also dotted, or a
    forward reference to it)."""
    if isinstance(annotation, str):
        return _annotation_name(annotation) == "Artifact"
    forward = getattr(annotation, "__forward_arg__", None)
    if isinstance(forward, str):
        return _annotation_name(forward) == "Artifact"
    return getattr(annotation, "__name__", None) == "Artifact"


def _artifact_info(annotation):
    """(is_list, is_optional) when annotation asks for an input artifact
    object (Artifact, List[Artifact], Optional[Artifact], Optional[List[
    Artifact]], their string forms), else None: the rules of the
    reference's get_artifact_info."""
    if annotation is _NO_ANNOTATION or annotation is None:
        return None
    if _names_artifact(annotation):
        return (False, False)
    if isinstance(annotation, str):
        if "Artifact" not in annotation:
            return None
        is_list = "List[Artifact]" in annotation or "list[Artifact]" in annotation
        is_optional = "Optional[Artifact]" in annotation or "None" in annotation
        if is_list or is_optional:
            return (is_list, is_optional)
        return None
    origin, members = _generic_parts(annotation)
    if not members:
        return None
    if origin is list:
        return (True, False) if _names_artifact(members[0]) else None
    if _is_union(annotation, origin):
        has_none = type(None) in members
        for member in members:
            if member is type(None):
                continue
            if _names_artifact(member):
                return (False, has_none)
            inner_origin, inner = _generic_parts(member)
            if inner_origin is list and inner and _names_artifact(inner[0]):
                return (True, has_none)
    return None


def _artifact_class():
    """The Artifact class to build input artifact objects with: the one the
    tool imported when it imported the reference's artifact_types (the
    real package or the runner's stand-in), else the stand-in."""
    module = sys.modules.get("solace_agent_mesh.agent.tools.artifact_types")
    cls = getattr(module, "Artifact", None)
    return cls if isinstance(cls, type) else Artifact


def _inject_artifact(kwargs, name, info, ctx, args):
    """Puts the Artifact object(s) for parameter name into kwargs, in
    place of the filename(s) the agent sent, as the reference's runner
    does: a single artifact from artifact_metadata[name], a list from
    artifact_metadata["name[0]"], ... for each filename in args[name]. A
    missing entry or file is skipped (the parameter keeps what the agent
    sent); a list parameter always receives a list (None stays None)."""
    is_list, _ = info
    metadata = ctx._artifact_metadata
    artifact_cls = None

    def load(meta):
        nonlocal artifact_cls
        if not isinstance(meta, dict) or not meta.get("local_path"):
            return None
        try:
            with open(meta["local_path"], "rb") as f:
                content = f.read()
        except OSError:
            return None
        if artifact_cls is None:
            artifact_cls = _artifact_class()
        return artifact_cls(
            content=content,
            filename=meta.get("filename") or "",
            version=meta.get("version", 0),
            mime_type=meta.get("mime_type") or "application/octet-stream",
        )

    if not is_list:
        artifact = load(metadata.get(name))
        if artifact is not None:
            kwargs[name] = artifact
        return
    filenames = args.get(name, [])
    if filenames is None:
        return
    if not isinstance(filenames, (list, tuple)):
        filenames = [filenames]
    artifacts = []
    for index in range(len(filenames)):
        artifact = load(metadata.get("%s[%d]" % (name, index)))
        if artifact is not None:
            artifacts.append(artifact)
    kwargs[name] = artifacts


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
    says so; the args go as keyword arguments. A parameter annotated as an
    Artifact (or a list or Optional of one) receives Artifact objects in
    place of the filenames among the args. A parameter not among the args
    named tool_config receives the tool config, one annotated as the
    context facade receives the ToolContextFacade (ToolContext: the legacy
    ctx), and one naming an input artifact receives its local path (see
    the module docstring). Raises TypeError when the result would not bind
    to fn's parameters.
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
        first = params[0][2]
        positional.append(ctx._portable_facade() if _context_kind(first) == _FACADE else ctx)
        rest = params[1:]
    for name, kind, annotation, _ in rest:
        if kind in _VARIADIC_KINDS:
            continue
        info = _artifact_info(annotation)
        if info is not None:
            _inject_artifact(kwargs, name, info, ctx, args)
            continue
        if name in args:
            continue
        context_kind = _context_kind(annotation)
        if name == "tool_config":
            kwargs["tool_config"] = tool_config
        elif context_kind is not None:
            kwargs[name] = ctx._portable_facade() if context_kind == _FACADE else ctx
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


def _call_dynamic_tool(tool, ctx, args):
    """Step 4 for a class-based tool of the DynamicTool shape, as the
    reference's runner calls it: the args as one dict, with Artifact
    objects for the instance's artifact_params and the ToolContextFacade
    under its ctx_facade_param_name, passed to
    _run_async_impl(args=..., tool_context=None)."""
    instance = tool.instance
    kwargs = dict(args)
    artifact_params = getattr(instance, "artifact_params", None) or {}
    for name, info in artifact_params.items():
        spec = (bool(getattr(info, "is_list", False)), bool(getattr(info, "is_optional", False)))
        _inject_artifact(kwargs, name, spec, ctx, args)
    facade_param = getattr(instance, "ctx_facade_param_name", None)
    if facade_param:
        kwargs[facade_param] = ctx._portable_facade()
    return instance._run_async_impl(args=kwargs, tool_context=None)


def _run_tool(call, is_coroutine):
    """Step 4: calls call(); runs a coroutine to completion."""
    result = call()
    if is_coroutine or _is_awaitable(result):
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


def _extract_output_artifacts(value, ctx):
    """Step 5a: the data objects of a ToolResult that are to become
    artifacts (disposition auto, artifact or artifact_with_preview) are
    written into the output directory under their names, as the
    reference's runner does, and removed from value.data_objects; the
    worker then saves them with the other output files (their mime type
    by extension, as for every output file). Inline ones stay in the
    result. Raises ValueError for an unsafe name (ctx.save_artifact)."""
    objects = getattr(value, "data_objects", None)
    if not objects:
        return
    remaining = []
    for obj in objects:
        disposition = getattr(obj, "disposition", None)
        if disposition in _ARTIFACT_DISPOSITIONS:
            ctx.save_artifact(obj.name, obj.content)
        else:
            remaining.append(obj)
    value.data_objects = remaining


# DataDisposition values whose data objects are saved as artifacts (a
# str-valued enum member compares equal to its value).
_ARTIFACT_DISPOSITIONS = ("artifact", "auto", "artifact_with_preview")


def _normalise(value):
    """Step 5b: the tool_result object. A ToolResult (anything with
    model_dump and data_objects, the reference's test) becomes its
    model_dump(); what JSON cannot hold becomes its str(), as the
    reference's json.dumps(default=str) does (bytes content of an inline
    data object reads "b'...'")."""
    if hasattr(value, "model_dump") and hasattr(value, "data_objects"):
        value = value.model_dump()
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


# --------------------------------------------------------------------------
# Init mode (mode "init"): describe the tool without calling it (spec
# section 14)

MODE_INIT = "init"


def _run_init(run_args, tool_config):
    """Returns {"result": InitInfo} or an error document.

    A class-based tool is instantiated as for a call (_instantiate), then,
    as the reference's init does: await instance.init(component=None,
    tool_config=<the tool config>); read tool_name, tool_description,
    parameters_schema (model_dump(exclude_none=True), to_dict() or a dict;
    a failure to read it leaves it out), ctx_facade_param_name and
    artifact_params; await instance.cleanup(...) (its failure is only
    logged). A function tool is described from its signature and docstring,
    as the reference's agent describes a function it wraps
    (_describe_function).
    """
    module_name = run_args.get("module") or ""
    class_name = run_args.get("class_name") or ""
    function_name = run_args.get("function") or ""
    if not module_name:
        return _error("no module given in runner arguments", "import")
    try:
        module = _import_module(module_name)
    except BaseException as e:
        return _error("cannot import module %r: %s" % (module_name, _describe(e, with_traceback=True)), "import")
    if not class_name:
        fn = getattr(module, function_name, None) if function_name else None
        if fn is None or not callable(fn):
            return _error("module %r has no callable attribute %r" % (module_name, function_name), "import")
        try:
            return {"result": _describe_function(fn)}
        except Exception as e:
            return _error(_describe(e, with_traceback=True), "execution")
    try:
        instance = _instantiate(module, module_name, class_name, tool_config)
    except _ImportFailure as e:
        return _error(str(e), "import")

    async def init_and_describe():
        init = getattr(instance, "init", None)
        if callable(init):
            done = init(component=None, tool_config=tool_config)
            if _is_awaitable(done):
                await done
        try:
            return _describe_instance(instance)
        finally:
            cleanup = getattr(instance, "cleanup", None)
            try:
                if callable(cleanup):
                    done = cleanup(component=None, tool_config=tool_config)
                    if _is_awaitable(done):
                        await done
            except Exception as e:  # the reference only logs it
                sys.stderr.write("str runner: cleanup() failed: %s\n" % _describe(e, with_traceback=False))

    import asyncio

    try:
        info = asyncio.run(init_and_describe())
    except BaseException as e:
        if _is_tool_error(e):
            return _error(str(e) or type(e).__name__, "tool")
        return _error(_describe(e, with_traceback=True), "execution")
    return {"result": info}


def _schema_dict(schema):
    """A parameters schema as JSON: a pydantic model (the agent's Schema)
    by model_dump(exclude_none=True), else to_dict(), else the dict."""
    if schema is None:
        return None
    if hasattr(schema, "model_dump"):
        schema = schema.model_dump(exclude_none=True)
    elif hasattr(schema, "to_dict"):
        schema = schema.to_dict()
    if not isinstance(schema, dict):
        return None
    return _json_safe(schema)


def _describe_instance(instance):
    """InitInfo of an initialised class-based tool; absent values omitted."""
    info = {}
    name = getattr(instance, "tool_name", None)
    if isinstance(name, str) and name:
        info["tool_name"] = name
    description = getattr(instance, "tool_description", None)
    if description is not None:
        info["description"] = str(description)
    try:
        schema = _schema_dict(getattr(instance, "parameters_schema", None))
    except Exception as e:  # the reference leaves the schema out
        sys.stderr.write("str runner: cannot read parameters_schema: %s\n" % _describe(e, with_traceback=False))
        schema = None
    if schema is not None:
        info["parameters_schema"] = schema
    facade_param = getattr(instance, "ctx_facade_param_name", None)
    if isinstance(facade_param, str) and facade_param:
        info["ctx_facade_param_name"] = facade_param
    artifact_params = getattr(instance, "artifact_params", None) or {}
    if isinstance(artifact_params, dict) and artifact_params:
        info["artifact_params"] = {
            str(name): {
                "is_list": bool(getattr(spec, "is_list", False)),
                "is_optional": bool(getattr(spec, "is_optional", False)),
            }
            for name, spec in artifact_params.items()
        }
    return info


# Python types -> the agent's Schema type names (the reference's type_map).
_SCHEMA_TYPES = {str: "STRING", int: "INTEGER", float: "NUMBER", bool: "BOOLEAN", list: "ARRAY", dict: "OBJECT"}
# Parameters the agent never sends (the reference's exclusions).
_SCHEMA_SKIPPED = ("tool_context", "tool_config", "kwargs", "self", "cls")


def _describe_function(fn):
    """InitInfo of a function tool, as the reference's agent describes a
    function it wraps (_FunctionAsDynamicTool): its __name__, its
    docstring (inspect.getdoc), and a schema from its signature: str,
    int, float, bool, list, dict as STRING, INTEGER, NUMBER, BOOLEAN,
    ARRAY, OBJECT (generics by their origin, the rest STRING), Optional
    as nullable, an Artifact parameter as STRING (a list of them as ARRAY
    of STRING), required when it has no default and is not Optional. The
    context facade parameter and those of _SCHEMA_SKIPPED are left out,
    and, unlike the reference, so is the first parameter that str's
    calling convention gives the legacy ctx. String annotations are
    resolved with typing.get_type_hints where they can be."""
    import inspect
    import typing

    convention = _convention(fn)
    params = convention.params or []
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    info = {"tool_name": getattr(fn, "__name__", "") or ""}
    doc = inspect.getdoc(fn)
    if doc:
        info["description"] = doc
    properties, required, artifact_params = {}, [], {}
    if params and _takes_context_first(params[0], {}, {}) and _context_kind(params[0][2]) != _FACADE:
        params = params[1:]
    for name, kind, annotation, has_default in params:
        if name in _SCHEMA_SKIPPED or kind in _VARIADIC_KINDS:
            continue
        annotation = hints.get(name, annotation)
        if _context_kind(annotation) is not None:
            if _context_kind(annotation) == _FACADE:
                info["ctx_facade_param_name"] = name
            continue
        optional = False
        origin, members = _generic_parts(annotation)
        if _is_union(annotation, origin) and type(None) in members:
            optional = True
        artifact = _artifact_info(annotation)
        if artifact is not None:
            is_list, artifact_optional = artifact
            artifact_params[name] = {"is_list": is_list, "is_optional": artifact_optional}
            nullable = optional or artifact_optional
            if is_list:
                prop = {"type": "ARRAY", "items": {"type": "STRING"}, "nullable": nullable}
            else:
                prop = {"type": "STRING", "nullable": nullable}
        else:
            if optional:
                annotation = next((m for m in members if m is not type(None)), None)
                origin, _ = _generic_parts(annotation)
            try:
                schema_type = _SCHEMA_TYPES.get(origin or annotation, "STRING")
            except TypeError:  # an unhashable annotation
                schema_type = "STRING"
            prop = {"type": schema_type, "nullable": optional}
        properties[name] = prop
        if not has_default and not optional:
            required.append(name)
    info["parameters_schema"] = {"type": "OBJECT", "properties": properties, "required": required}
    if artifact_params:
        info["artifact_params"] = artifact_params
    return info


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
    "       runner.py --template CTRL_FD MODULE FUNCTION [CLASS_NAME]\n"
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
        elif opt == "--template":
            warm = "template"
        else:
            raise ValueError("unknown option %s" % opt)
    if warm and not 3 <= len(args) <= 4:
        raise ValueError("--warm and --template take FD MODULE FUNCTION [CLASS_NAME]")
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
    module, asyncio for a coroutine tool. The modules the runner imports
    lazily (unicodedata for artifact filenames, traceback for errors) stay
    lazy, as in a cold run: importing them here cost every pooled sandbox
    ~10-17 ms of CPU (traceback brings re, tokenize, linecache; -X
    importtime), mostly for calls that never need them."""
    _register_facade_module()
    try:
        module = _import_module(module_name)
    except BaseException as e:  # module code may raise anything, even SystemExit
        _PRELOAD_FAILURES[module_name] = "cannot import module %r: %s" % (
            module_name,
            _describe(e, with_traceback=True),
        )
        module = None
    try:
        fn = None
        if module is not None and class_name:
            # a DynamicTool's _run_async_impl (the class is instantiated per call)
            fn = getattr(getattr(module, class_name, None), "_run_async_impl", None)
        elif module is not None and function_name:
            fn = getattr(module, function_name, None)
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    except Exception:  # a module's or class's __getattr__: the call will say
        code = None
    if code is not None and code.co_flags & CO_COROUTINE:
        import asyncio  # noqa: F401 - ~35 ms, now off the request path


def _site_paths():
    """Under -S, what site would have set up for the tools, without its
    .pth files and customize hooks (see "Interpreter start" above)."""
    if not sys.flags.no_site:
        return
    import site

    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    for d in (exe_dir, os.path.dirname(exe_dir)):
        if os.path.isfile(os.path.join(d, "pyvenv.cfg")):
            site.main()  # a virtual environment: site's own rules
            return
    for d in site.getsitepackages():
        if os.path.isdir(d) and d not in sys.path:
            sys.path.append(d)
    site.setquit()
    site.setcopyright()
    site.sethelper()


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
    # The interpreter's site-packages (-S left them out), before any tool
    # module is imported (the warm preload below included).
    _site_paths()

    # 0. template mode (launcher/template): import once, then fork
    # each call into namespaces of its own; never returns.
    if warm == "template":
        return _template(int(rest[0]), rest[1], rest[2], rest[3] if len(rest) > 3 else "")

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
    if run_args.get("mode") == MODE_INIT or run_args.get("init_mode") is True:
        return _run_init(run_args, tool_config)

    # 2. import
    try:
        fn = _load_callable(run_args)
    except _ImportFailure as e:
        return _error(str(e), "import")

    # 3. context and call arguments
    ctx = ToolContext(run_args)
    if isinstance(fn, _DynamicTool):
        is_coroutine = False  # _run_tool awaits what _run_async_impl returns

        def call():
            return _call_dynamic_tool(fn, ctx, args)

    else:
        try:
            convention = _convention(fn)
            positional, kwargs = _build_call(fn, convention, ctx, args, tool_config)
        except TypeError as e:
            return _error("TypeError: %s" % e, "execution")
        is_coroutine = convention.is_coroutine

        def call():
            return fn(*positional, **kwargs)

    # 4. run, and 5a. write the artifacts of a ToolResult's data objects
    try:
        value = _run_tool(call, is_coroutine)
        _extract_output_artifacts(value, ctx)
    except BaseException as e:
        if _is_tool_error(e):
            return _error(str(e) or type(e).__name__, "tool")
        return _error(_describe(e, with_traceback=True), "execution")

    # 5b. normalise
    document = {"result": _normalise(value)}
    if ctx._output_mime_types:
        document["output_mime_types"] = dict(ctx._output_mime_types)
    return document


# ---- template mode ----------------------------------------------------
#
# A per-tool template (launcher/template) is this runner, started once
# in a sandbox of the tool's profile with --template CTRL_FD: it imports
# the tool (_preload, as warm mode), freezes what it allocated
# (gc.freeze: the children's reference counting then touches fewer shared
# pages), says "ready" on the control socket and waits for fork orders.
# The supervisor (the launcher's process) reads its fds, maps and threads
# from the host and refuses a template that holds anything shared.
#
# Per order the template clones once with the flags the order names, the
# only clone its seccomp filter sends to the supervisor, which lets it
# through because it ordered it. The child, alone in fresh user, mount,
# pid, network, ipc, uts and cgroup namespaces, says hello on the call's
# socket (the kernel attaches its pid for the supervisor). Everything that
# can be done to it from outside, the supervisor does from the host before
# it sends the setup: its id maps, its network, its cgroup, its process
# limit and its fresh mounts. The child then does only what acts on its own
# process and nothing else can: it drops every capability and sets its
# ids, closes every other descriptor, reseeds the RNG, stacks the call's
# seccomp filter, says "ready", and only then receives the call: the same
# runner arguments a cold run reads, run by the same _run, answered on the
# socket.
#
# None of this is a protection against the tool: its import-time code ran
# in this interpreter and may have rewritten any of it. The supervisor
# verifies from the host what the child must have done before it sends
# the call, and the filters hold whatever the Python code does.

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_CLOSE_RANGE_MAX = 0xFFFFFFFF


def _send(sock, obj, fds=()):
    import socket

    data = _json_dumps(obj).encode("utf-8")
    if fds:
        import array

        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendmsg([data])


def _recv(sock, size=1 << 16):
    import array
    import socket

    fds = array.array("i")
    data, anc, flags, _ = sock.recvmsg(size, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    if not data:
        raise EOFError("the supervisor closed the socket")
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise ValueError("message truncated")
    return _json_loads(data.decode("utf-8")), list(fds)


def _template(ctrl_fd, module_name, function_name, class_name):
    import ctypes
    import gc
    import socket

    ctrl = socket.socket(fileno=ctrl_fd)
    _preload(module_name, function_name, class_name)
    libc = _template_prepare()
    before = ctypes.pythonapi.PyOS_BeforeFork
    after_parent = ctypes.pythonapi.PyOS_AfterFork_Parent
    after_child = ctypes.pythonapi.PyOS_AfterFork_Child
    import select
    import signal

    # Children are ours to reap, at once (SIGCHLD: the supervisor removes
    # a call's cgroup when its process is gone, and a zombie still holds
    # it), and at least every half second. No wake-up pipe: the template
    # holds no descriptor but 0-2 and the control socket, which the
    # supervisor checks.
    signal.signal(signal.SIGCHLD, _template_reap)
    gc.collect()
    gc.freeze()
    _send(ctrl, {"type": "ready"})
    while True:
        ready, _, _ = select.select([ctrl], [], [], 0.5)
        _template_reap()
        if ctrl not in ready:
            continue
        try:
            order, fds = _recv(ctrl)
        except EOFError:
            os._exit(0)
        if order.get("type") != "fork" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            _send(ctrl, {"type": "fork_failed", "error": "bad order"})
            continue
        # SIGCHLD (a previous call ending) is blocked across the clone: a
        # signal that arrives while the kernel copies the process makes
        # it restart the clone (ERESTARTNOINTR), and the supervisor, whose
        # order the first attempt took, refuses the second.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        before()
        pid = libc.syscall(ctypes.c_long(order["nr"]), ctypes.c_long(order["flags"]), ctypes.c_long(0),
                           ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
        err = ctypes.get_errno()
        if pid == 0:
            after_child()
            _template_child(ctrl, fds[0], old_mask)  # never returns
        after_parent()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        os.close(fds[0])
        if pid < 0:
            _send(ctrl, {"type": "fork_failed", "error": os.strerror(err), "errno": err})
        else:
            _send(ctrl, {"type": "forked"})


# What every call's child needs, made once in the template before its
# first fork (a child inherits it): each child then allocates and imports
# nothing for its setup. Work done in a child is paid again by every call,
# and every page a child writes is copied from the template
# (copy-on-write faults are most of a template call's CPU, measured).
_TPL = {}


def _template_prepare():
    """Fills _TPL; returns the libc handle (the template's own forks use it)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    _TPL["libc"] = libc
    _TPL["fprog"] = _Fprog
    # The highest capability this kernel knows: the bounding set is emptied
    # cap by cap up to it (a higher one is EINVAL, which was 64 - N calls
    # of nothing per child).
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            _TPL["last_cap"] = int(f.read())
    except (OSError, ValueError):
        _TPL["last_cap"] = 63
    return libc


def _template_reap(*_):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _template_child(ctrl, call_fd, mask):
    """A call's child: set up as the supervisor says, then run the call.
    Exits, never returns; any failure exits 125 (the supervisor kills a
    child that does not end up as it verifies anyway)."""
    try:
        _template_call(ctrl, call_fd, mask)
    except BaseException as e:
        try:
            sys.stderr.write("str runner (template call): %s\n" % (e,))
        except BaseException:
            pass
        os._exit(125)
    os._exit(0)


def _template_call(ctrl, call_fd, mask):
    import ctypes
    import socket

    import signal

    # The template's reaper and control socket are not the call's.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(ctrl.detach())
    sock = socket.socket(fileno=call_fd)
    # 1. hello: the kernel attaches our pid (SO_PASSCRED on the other end).
    _send(sock, {"type": "hello"})
    # 2. the setup: ids, the call filter, syscall numbers. The supervisor
    # sends it once its mounts are in our mount namespace (it attached
    # them from the host: we hold no mount descriptor and call no
    # move_mount), its id maps written and our process limit set.
    setup, fds = _recv(sock)
    for fd in fds:
        os.close(fd)
    nr = setup["nr"]
    libc = _TPL["libc"]

    def sys_(name, *args):
        r = libc.syscall(ctypes.c_long(nr[name]), *args)
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (name, os.strerror(e)))
        return r

    # The cwd is per process: the template's, until we leave it for our
    # root (under the fresh mounts, now that they are in; checked from
    # the host).
    os.chdir("/")
    # 3. capabilities: the bounding set while we still hold CAP_SETPCAP
    # (of our own user namespace), then the ids, then every set empty.
    # Each acts on the calling process only (prctl, setresuid, capset on
    # ourselves): nothing outside can do it to us.
    for cap in range(_TPL["last_cap"] + 1):
        if libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP %d" % cap)
    os.setresgid(setup["gid"], setup["gid"], setup["gid"])
    os.setresuid(setup["uid"], setup["uid"], setup["uid"])
    # Every capability set empty: the uid in this user namespace was never
    # 0 (the template's is not mapped here), so the uid change cleared
    # nothing by itself (the template's filter allows capset).
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    sys_("capset", hdr, data)
    # The uid change cleared the parent-death signal: the call dies with
    # its template (the signal is the calling process's own setting).
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    # It also made the process non-dumpable, and no execve follows to
    # make it dumpable again, as a cold sandbox's tool's does: its
    # /proc/self would be root's (overflow), so the tool could not list
    # its own /proc/self/fd or ns. Dumpable as a cold tool is: ptrace and
    # process_vm_* stay EPERM in the filter, and the template, which owns
    # the call's user namespace, could reach it either way (it has no /proc).
    # Dumpable is the calling process's own flag.
    if libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(1), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE")
    # 4. descriptors: stdio is /dev/null, the call's socket is 3, nothing
    # else (our own descriptor table: the fork copied the template's).
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if sock.fileno() != 3:
        os.dup2(sock.fileno(), 3)
        old = sock.detach()
        if old != 3:
            os.close(old)
        sock = socket.socket(fileno=3)
    if null > 3:
        os.close(null)
    sys_("close_range", ctypes.c_uint(4), ctypes.c_uint(_CLOSE_RANGE_MAX), ctypes.c_uint(0))
    # 5. RNG state: the template's was copied into every child, into our
    # own memory, where only we can replace it. Reseeded
    # from the kernel: the standard library's shared generator and
    # numpy's legacy global one (a tool that imported them). os.urandom,
    # secrets, uuid4 and SystemRandom read the kernel on every use; a
    # generator object a tool builds and keeps at import is its own and
    # is shared by its calls (README, "Not done yet"); tempfile's name
    # generator is too, harmlessly: every call's /tmp is fresh.
    if "random" in sys.modules:
        sys.modules["random"].seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    # 6. the call's filter, stacked on the template's (no_new_privs is
    # inherited): the notified clone and the template's other openings
    # are closed again. The bytes are the supervisor's; a filter is loaded
    # only by the process it filters.
    prog = bytes.fromhex(setup["call_filter"])
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _TPL["fprog"](len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")
    # 7. ready: the supervisor verifies all of the above from the host,
    # and only then sends the call.
    _send(sock, {"type": "ready"})
    call, fds = _recv(sock, 64 << 20)
    for fd in fds:
        os.close(fd)
    # The call's work dir is its cwd, as a cold run's is.
    if setup.get("cwd"):
        os.chdir(setup["cwd"])
    document = _run(call)
    # 8. the answer.
    _send_result(sock, document, setup["result_chunk"])


def _send_result(sock, document, chunk):
    """A template call's step 8, its _write_result: the document's size,
    then the document in pieces of at most chunk bytes (one message must
    fit the socket's send buffer; launcher.recvDocument). The worker
    checks what arrives as it checks a result file (runner.DecodeResult):
    the tool runs in this process and can replace this function."""
    data = _json_dumps(document).encode("utf-8")
    _send(sock, {"type": "result", "size": len(data)})
    for i in range(0, len(data), chunk):
        sock.sendmsg([data[i : i + chunk]])


def _register_facade_module():
    mod = type(sys)("str_tool")  # types.ModuleType, without importing types
    mod.__doc__ = "Names a str tool may import while running under the str runner."
    mod.ToolError = ToolError
    mod.ToolContext = ToolContext
    mod.ToolContextFacade = ToolContextFacade
    sys.modules.setdefault("str_tool", mod)
    _install_reference_shim()


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
