"""A portable tool: the facade injected by annotation, a ToolResult back."""

from solace_agent_mesh.agent.tools.tool_result import DataObject, ToolResult
from solace_agent_mesh.agent.utils.tool_context_facade import ToolContextFacade


async def portable_echo(message: str, ctx: ToolContextFacade) -> ToolResult:
    ctx.send_status("portable echo")
    return ToolResult.ok(
        message="Echoed: %s" % message,
        data_objects=[DataObject(name="echo_output.txt", content="Echoed: %s for %s" % (message, ctx.user_id), mime_type="text/plain")],
    )
