"""str's stand-ins for the reference's example sandbox tools (same names
and parameters, our own small bodies)."""

import contextlib
import io


def echo_tool(message: str = "hello", ctx=None):
    """Echoes the message back."""
    if ctx is not None:
        ctx.send_status("echoing")
    return {"echo": message, "from": "sandbox"}


def execute_python(code: str, ctx=None):
    """Runs Python code inside the sandbox and returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<code>", "exec"), {})
    return {"stdout": out.getvalue()}
