"""The tools a policy may call: name -> function(arguments: dict, cfg) -> output text.

    @tool("python")
    def python(arguments, cfg): ...

`cfg` is the sampler's ToolsConfig (limits such as timeout_s). A function raises ToolError for a call it cannot
serve (a missing or mistyped argument): the policy then reads the message as the tool's answer. Any other
exception is caught by the runner and reported the same way; nothing a call does ends a rollout.
"""
from __future__ import annotations

from typing import Any, Callable

ToolFn = Callable[[dict, Any], str]
TOOLS: dict[str, ToolFn] = {}


class ToolError(Exception):
    """A call the tool refuses (bad arguments); its message is what the policy reads."""


def tool(name: str) -> Callable[[ToolFn], ToolFn]:
    def register(fn: ToolFn) -> ToolFn:
        if name in TOOLS and TOOLS[name] is not fn:
            raise ValueError(f"tool {name!r} is registered twice")
        TOOLS[name] = fn
        return fn
    return register


def string_argument(arguments: dict, name: str, tool_name: str) -> str:
    """arguments[name] as a string, or ToolError naming what is wrong."""
    if name not in arguments:
        raise ToolError(f"tool {tool_name!r} needs the argument {name!r}")
    value = arguments[name]
    if not isinstance(value, str):
        raise ToolError(f"tool {tool_name!r}: argument {name!r} must be a string, got {type(value).__name__}")
    return value
