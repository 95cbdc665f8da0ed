"""A tiny Qwen2 that calls tools: the `tiny` preset trained briefly (200 Adam steps) to reproduce a handful of
tool-using traces (ask -> python call -> tool turn -> ... -> answer), so the sampler's tool path can be run end to
end with real calls (tests/sampling/test_tool_*.py, bench/sampler.py --tools). Random weights never write a tool call.

    tok = build_tiny_tokenizer(dir); model, prompts = tool_policy(tok, n_traces=4, calls=2)
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.tools.format import tool_turn


def traces(n: int, calls: int, tool: str = "python", seed: int = 0) -> list[tuple[str, list[str], list[str]]]:
    """(prompt text, the policy's turns, the tool outputs) of n conversations with `calls` calls each: products of
    two random 3-digit numbers, each call printing one, the answer summing them."""
    rng = np.random.RandomState(seed)
    out = []
    for i in range(n):
        pairs = [tuple(rng.randint(100, 1000, 2)) for _ in range(calls)]
        question = f"Sum of {' and '.join(f'{a}*{b}' for a, b in pairs)}?"
        prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        turns = [f'<tool_call>\n{json.dumps({"name": tool, "arguments": {"code": f"print({a}*{b})"}})}\n</tool_call>'
                 for a, b in pairs]
        outputs = [str(a * b) for a, b in pairs]
        turns.append(f"The answer is {sum(a * b for a, b in pairs)}.<|im_end|>")
        out.append((prompt, turns, outputs))
    return out


def render(prompt: str, turns: list[str], outputs: list[str]) -> str:
    """The whole conversation as the sampler builds it: each policy turn, then the tool turn answering it."""
    return prompt + "".join(t + (tool_turn([o]) if k < len(outputs) else "") for k, (t, o) in
                            enumerate(zip(turns, [*outputs, ""])))


def tool_policy(tokenizer, n_traces: int = 4, calls: int = 2, steps: int = 200, tool: str = "python", seed: int = 0,
                lr: float = 3e-3):
    """(model, prompts as ids, the traces) with the model trained on the traces' whole sequences until it
    reproduces them greedily."""
    data = traces(n_traces, calls, tool, seed)
    seqs = [tokenizer.encode(render(*t)) for t in data]
    W = max(map(len, seqs)) + 1
    toks = np.zeros((len(seqs), W), np.int32)
    mask = np.zeros((len(seqs), W - 1), np.float32)
    for i, s in enumerate(seqs):
        toks[i, :len(s)] = s
        mask[i, :len(s) - 1] = 1
    model = create_model(preset("tiny"), seed=seed)
    opt = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, toks, mask):
        def loss_fn(m):
            logits = m(toks[:, :-1])[0]
            nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), toks[:, 1:])
            return jnp.sum(nll * mask) / jnp.sum(mask)
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    for _ in range(steps):
        loss = step(model, opt, jnp.asarray(toks), jnp.asarray(mask))
    jax.block_until_ready(loss)
    return model, [tokenizer.encode(p) for p, _, _ in data], data
