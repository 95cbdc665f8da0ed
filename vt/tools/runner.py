"""ToolRunner: answers a policy turn that ends a tool call, on a thread pool, never raising.

    runner = ToolRunner(tools_cfg, tokenizer)
    future = runner.submit(turn_ids)      # the policy's tokens since its last tool turn, ending </tool_call>
    ids, ok = future.result()             # the tool turn's tokens; ok False for an error turn

A malformed call (not JSON, no name, unknown tool, bad arguments) or a tool that raises gets an error turn the
policy can read ("Error: ..."); output past `max_tool_output_tokens` is cut with a visible note.
"""
from __future__ import annotations

import concurrent.futures as cf
from typing import Sequence

from vt.tools import python as _python  # noqa: F401  (registers the built-in `python` tool)
from vt.tools.format import cap_output, error_output, parse_tool_call, tool_turn
from vt.tools.registry import TOOLS, ToolError


class ToolRunner:
    def __init__(self, cfg, tokenizer):
        unknown = [t for t in cfg.tools if t not in TOOLS]
        if unknown:
            raise ToolError(f"unknown tool {unknown[0]!r} in the sampler's tools "
                            f"(registered: {', '.join(sorted(TOOLS))})")
        self.cfg, self.tokenizer = cfg, tokenizer
        self._pool = cf.ThreadPoolExecutor(cfg.workers, thread_name_prefix="vt-tool")

    def submit(self, turn_ids: Sequence[int]) -> cf.Future:
        return self._pool.submit(self.respond, list(turn_ids))

    def output(self, turn_text: str) -> tuple[str, bool]:
        """(what the tool returns for the call ending `turn_text`, whether the call ran)."""
        try:
            call = parse_tool_call(turn_text)
            if call.name not in self.cfg.tools:
                raise ToolError(f"unknown tool {call.name!r}; the tools are: {', '.join(self.cfg.tools)}")
            return TOOLS[call.name](call.arguments, self.cfg), True
        except ToolError as e:
            return error_output(str(e)), False
        except Exception as e:  # noqa: BLE001 - a tool's failure is the policy's to read, never the rollout's end
            return error_output(f"the tool failed: {type(e).__name__}: {e}"), False

    def respond(self, turn_ids: list[int]) -> tuple[list[int], bool]:
        tok = self.tokenizer
        out, ok = self.output(tok.decode(turn_ids))
        out = cap_output(out, tok.encode, tok.decode, self.cfg.max_tool_output_tokens)
        return tok.encode(tool_turn([out])), ok

    def close(self) -> None:
        """Cancel the calls not started, wait for those running (each bounded by its tool's limits), end the
        threads."""
        self._pool.shutdown(wait=True, cancel_futures=True)
