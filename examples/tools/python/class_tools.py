"""Class-based ("dynamic") example tools, written the way the reference
runtime's DynamicTool subclasses are (manifest: `class_name:` instead of
`function:`).

The worker instantiates the class with tool_config=<the tool's config>,
and for each call awaits `_run_async_impl(args=<the args as one dict>,
tool_context=None)`. Before the agent lists the tool, the init
sub-protocol instantiates it the same way, awaits `init()`, and reports
`tool_name`, `tool_description` and `parameters_schema`: a description
computed in init() reaches the agent.

DynamicTool comes from the reference's package when it is installed in
the sandbox, and otherwise from the str runner's stand-in of it. A real
tool would usually return an ADK `types.Schema` from parameters_schema;
these return the same structure as a dict, so they need no google-genai.
"""

import sys

from solace_agent_mesh.agent.tools.dynamic_tool import DynamicTool


class GreeterTool(DynamicTool):
    """Greets a name with a configured prefix; init() enriches the
    description with the Python it runs on (a stand-in for what a real tool
    discovers at start-up, such as a database's tables)."""

    def __init__(self, tool_config=None):
        super().__init__(tool_config=tool_config)
        self._prefix = (tool_config or {}).get("greeting_prefix", "Hello")
        self._enriched = None

    @property
    def tool_name(self):
        return "greeter"

    @property
    def tool_description(self):
        if self._enriched:
            return self._enriched
        return "Greets a name (description not yet enriched by init)."

    @property
    def parameters_schema(self):
        return {
            "type": "OBJECT",
            "properties": {
                "name": {"type": "STRING", "description": "Who to greet"},
                "shout": {"type": "BOOLEAN", "description": "Upper-case the greeting", "nullable": True},
            },
            "required": ["name"],
        }

    async def init(self, component, tool_config):
        version = "%d.%d" % sys.version_info[:2]
        self._enriched = "Greets a name with the prefix %r (Python %s)." % (self._prefix, version)

    async def _run_async_impl(self, args, tool_context=None, credential=None):
        greeting = "%s, %s!" % (self._prefix, args.get("name", "World"))
        if args.get("shout"):
            greeting = greeting.upper()
        return {"greeting": greeting, "tool_context_is_none": tool_context is None}


class WordCountTool(DynamicTool):
    """A class-based tool that receives an input artifact and the context
    facade through its artifact_params and ctx_facade_param_name, and
    whose _run_async_impl is a plain (synchronous) method: str calls it and
    uses the dict it returns (the reference only awaits it)."""

    @property
    def tool_name(self):
        return "word_count"

    @property
    def tool_description(self):
        return "Counts the words of a text artifact."

    @property
    def parameters_schema(self):
        return {
            "type": "OBJECT",
            "properties": {"document": {"type": "STRING", "description": "Artifact filename"}},
            "required": ["document"],
        }

    @property
    def artifact_args(self):
        return ["document"]

    @property
    def ctx_facade_param_name(self):
        return "ctx"

    def _run_async_impl(self, args, tool_context=None, credential=None):
        document, ctx = args["document"], args["ctx"]
        ctx.send_status("counting words of %s" % document.filename)
        return {
            "filename": document.filename,
            "version": document.version,
            "words": len(document.as_text().split()),
            "user_id": ctx.user_id,
        }
