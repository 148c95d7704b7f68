"""A portable tool taking an Artifact parameter."""

from solace_agent_mesh.agent.tools.artifact_types import Artifact
from solace_agent_mesh.agent.tools.tool_result import ToolResult


def portable_process_file(input_file: Artifact) -> ToolResult:
    text = input_file.as_text()
    return ToolResult.ok(message="%s: %d words" % (input_file.filename, len(text.split())))
