"""Portable example tools: the reference runtime's newer tool API, where the
same function runs in-process under an agent and in a sandbox.

- A parameter annotated ToolContextFacade receives the context facade
  (send_status, get_config, user_id, ...; async load_artifact(filename)).
- A parameter annotated Artifact (or List[Artifact], Optional[Artifact])
  receives the input artifact itself, loaded by the worker: an object with
  content, filename, version, mime_type and as_text() / as_bytes(). The
  agent sends the artifact's filename for it.
- A ToolResult return value is sent back as the reference sends it; its
  DataObjects with disposition auto, artifact or artifact_with_preview
  become artifacts (created_artifacts) and leave the result, inline ones
  stay in it.

The types come from the reference's package when it is installed in the
sandbox, else from the str runner's stand-ins of them.
"""

from typing import List, Optional

from solace_agent_mesh.agent.tools.artifact_types import Artifact
from solace_agent_mesh.agent.tools.tool_result import DataDisposition, DataObject, ToolResult
from solace_agent_mesh.agent.utils.tool_context_facade import ToolContextFacade


async def portable_echo(message: str, ctx: ToolContextFacade) -> ToolResult:
    """Echoes a message and saves it as echo_output.txt."""
    ctx.send_status("Processing message...")
    text = "Echoed: %s\nUser: %s\nSession: %s" % (message, ctx.user_id, ctx.session_id)
    return ToolResult.ok(
        message="Echoed: %s" % message,
        data_objects=[DataObject(name="echo_output.txt", content=text, mime_type="text/plain")],
    )


def portable_echo_sync(message: str, ctx: ToolContextFacade) -> ToolResult:
    """portable_echo as a plain function, with an inline data object that
    stays in the result."""
    ctx.send_status("Processing message...")
    return ToolResult.ok(
        message="Echoed: %s" % message,
        data={"length": len(message)},
        data_objects=[
            DataObject(name="echo_output.txt", content="Echoed: %s" % message, disposition=DataDisposition.ARTIFACT),
            DataObject(name="note", content="inline, not saved", disposition="inline"),
        ],
    )


async def portable_process_file(input_file: Artifact, ctx: ToolContextFacade) -> ToolResult:
    """Summarises a text artifact and saves the summary as an artifact."""
    ctx.send_status("Processing %s..." % input_file.filename)
    content = input_file.as_text()
    lines = content.split("\n")
    summary = "\n".join(
        [
            "Filename: %s" % input_file.filename,
            "MIME type: %s" % input_file.mime_type,
            "Version: %s" % input_file.version,
            "Lines: %d" % len(lines),
            "Words: %d" % len(content.split()),
        ]
    )
    same = await ctx.load_artifact(input_file.filename, as_text=True)
    return ToolResult.ok(
        message="Processed %s: %d lines" % (input_file.filename, len(lines)),
        data={"line_count": len(lines), "facade_sees_same_bytes": same == content},
        data_objects=[DataObject(name="processing_summary.txt", content=summary, mime_type="text/plain")],
    )


def portable_merge(parts: List[Artifact], header: Optional[Artifact] = None, separator: str = "\n") -> ToolResult:
    """Joins several artifacts (and an optional header) into merged.bin."""
    pieces = [header.as_bytes()] if header is not None else []
    pieces += [part.as_bytes() for part in parts]
    merged = separator.encode().join(pieces)
    return ToolResult.ok(
        message="Merged %d artifacts" % len(pieces),
        data={"names": [part.filename for part in parts], "header": header.filename if header else None},
        data_objects=[DataObject(name="merged.bin", content=merged, mime_type="application/octet-stream")],
    )
