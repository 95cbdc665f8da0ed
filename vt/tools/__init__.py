"""Tools a policy calls while it generates (Qwen's `<tool_call>` format), for the sampler's multi-turn rollouts.

  registry.py  TOOLS (name -> function) and the `tool` decorator: adding a tool is one function
  python.py    the `python` tool: code run in vt's warm, isolated sandbox pool, stdout (and a traceback) back
  format.py    parsing a turn's `<tool_call>`, the `tool` turn as the chat template renders it, output caps
  runner.py    ToolRunner: a policy turn's tokens -> the tool turn's tokens, on a thread pool (never raises)

The sampler (vt.sampling.engine) parks a sample whose turn ends `</tool_call>`, hands the turn to a ToolRunner and
resumes the sample with the tool turn's tokens once they are ready. This package imports no JAX and nothing of
vt.sampling (which imports it): the tools' settings arrive as vt.sampling.config.ToolsConfig, read by attribute.
"""
