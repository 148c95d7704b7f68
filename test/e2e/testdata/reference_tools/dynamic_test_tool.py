"""Class-based tools in the reference's DynamicTool style: init() enriches
the description with what the tool finds at start-up (here, its config and
the interpreter it runs on, inside the sandbox)."""

import os
import sys

from solace_agent_mesh.agent.tools.dynamic_tool import DynamicTool


class DynamicTestTool(DynamicTool):
    def __init__(self, tool_config=None):
        super().__init__(tool_config=tool_config)
        self._prefix = (tool_config or {}).get("greeting_prefix", "Hello from sandbox")
        self._enriched = None

    @property
    def tool_name(self):
        return "dynamic_test"

    @property
    def tool_description(self):
        return self._enriched or "A dynamic test tool (description not yet enriched by init)."

    @property
    def parameters_schema(self):
        return {
            "type": "OBJECT",
            "properties": {"name": {"type": "STRING", "description": "A name to greet"}},
            "required": ["name"],
        }

    async def init(self, component, tool_config):
        self._enriched = "Greets with %r on Python %d.%d as uid %d." % (
            self._prefix, sys.version_info[0], sys.version_info[1], os.getuid())

    async def _run_async_impl(self, args, tool_context=None, credential=None):
        return {"greeting": "%s, %s!" % (self._prefix, args.get("name", "World"))}


class BrokenInitTool(DynamicTestTool):
    async def init(self, component, tool_config):
        raise RuntimeError("cannot reach the inventory database")
