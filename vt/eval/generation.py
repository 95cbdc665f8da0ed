"""The generation boundary of evaluation, CLR and data construction: chat conversations in, completions out.

    class Generator(Protocol):
        def generate(self, conversations, n, seed) -> list[list[Completion]]   # [i][j]: sample j of conv i

``max_new_tokens`` (optional) caps this call's completions below the generator's default (CLR's claim
and verification prompts need fewer tokens than a solution). Sample j of conversation i must depend only
on (seed, i, j) -- vt's Engine guarantees this -- so a killed and resumed evaluation regenerates a chunk
of problems exactly. Conversations (not token ids) are
the unit so a stand-in model, vt's sampler on a checkpoint and an OpenAI-compatible endpoint all fit.

A *teacher* / *judge* is the narrower ``Callable[[list[messages]], list[str | BaseException]]`` used by
vt.rewards.rubric and vt.datagen: one reply per conversation. :func:`as_teacher` turns a Generator into
one; :class:`TeacherGenerator` goes the other way.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from vt import VtError
from vt.checkpoint.params import load_model
from vt.data.tokenizer import load_tokenizer
from vt.rewards.rubric import OpenAIChatJudge
from vt.sampling.config import Request, SamplerConfig
from vt.sampling.engine import Engine
from vt.tools.answer import final_answer

Messages = list[dict[str, str]]
Teacher = Callable[[list[Messages]], list[Any]]  # list[str | BaseException]


@dataclasses.dataclass(frozen=True)
class Completion:
    text: str
    num_tokens: int
    finish_reason: str  # "stop" or "length" (truncated); with tools also "max_turns"
    # With the sampler's tools (SamplerConfig.tools): the calls the sample made and how many got an error turn; its
    # text is then the final answer, after the last tool turn (vt.tools.answer)
    tool_calls: int = 0
    tool_errors: int = 0


class Generator(Protocol):
    def generate(self, conversations: Sequence[Messages], n: int, seed: int,
                 max_new_tokens: int | None = None) -> list[list[Completion]]:
        ...


class EngineGenerator:
    """vt.sampling's Engine behind the Generator protocol.

    Prompts are rendered with the tokenizer's chat template plus the assistant generation prompt; the
    completion text is decoded without special tokens (the stop token is dropped).
    """

    def __init__(self, engine, tokenizer, max_new_tokens: int | None = None):
        self.engine, self.tokenizer, self.max_new_tokens = engine, tokenizer, max_new_tokens

    def close(self) -> None:  # the engine's tool threads (vt.sampling.engine.Engine.close)
        self.engine.close()

    def generate(self, conversations: Sequence[Messages], n: int, seed: int,
                 max_new_tokens: int | None = None) -> list[list[Completion]]:
        cap = max_new_tokens or self.max_new_tokens
        requests = [Request(prompt_ids=self.tokenizer.encode_chat(list(c), add_generation_prompt=True), n=n,
                            max_new_tokens=cap) for c in conversations]
        out = self.engine.generate(requests, seed=seed)
        stop = set(self.engine.stop_ids)
        result = []
        for per_conv in out:
            row = []
            for s in per_conv:
                ids = list(s.completion_ids)
                body = ids[:-1] if ids and ids[-1] in stop else ids
                text = (s.text if s.text is not None else self.tokenizer.decode(body, skip_special_tokens=True)
                        ) if s.policy_mask is None else final_answer(s, self.tokenizer)
                row.append(Completion(text=text, num_tokens=len(ids), finish_reason=s.finish_reason,
                                      tool_calls=s.tool_calls, tool_errors=s.tool_errors))
            result.append(row)
        return result


def engine_generator(ckpt: str, tokenizer_path: str, sampler: SamplerConfig) -> EngineGenerator:
    """Load a vt checkpoint and its tokenizer into an :class:`EngineGenerator`."""
    tok = load_tokenizer(tokenizer_path)
    return EngineGenerator(Engine(load_model(ckpt), sampler, tokenizer=tok), tok, sampler.max_new_tokens)


def as_teacher(generator: Generator, seed: int = 0) -> Teacher:
    """One completion per conversation; every call uses a fresh seed (seed, seed + 1, ...)."""
    state = {"calls": 0}

    def teacher(conversations: list[Messages]) -> list[str]:
        s = seed + state["calls"]
        state["calls"] += 1
        return [row[0].text for row in generator.generate(conversations, 1, s)]

    return teacher


class TeacherGenerator:
    """A teacher / endpoint client as a Generator: n samples = the conversation sent n times.

    Token counts are unknown behind an endpoint: ``num_tokens`` is the reply's word count and
    ``finish_reason`` "stop". A failed call (an exception in the reply list) raises VtError.
    """

    def __init__(self, teacher: Teacher):
        self.teacher = teacher

    def generate(self, conversations: Sequence[Messages], n: int, seed: int,
                 max_new_tokens: int | None = None) -> list[list[Completion]]:
        flat = [list(c) for c in conversations for _ in range(n)]
        replies = self.teacher(flat)
        if len(replies) != len(flat):
            raise VtError(f"teacher returned {len(replies)} replies for {len(flat)} conversations")
        out = []
        for i in range(len(conversations)):
            row = []
            for r in replies[i * n:(i + 1) * n]:
                if isinstance(r, BaseException):
                    raise VtError(f"teacher failed on conversation {i}: {r}")
                row.append(Completion(text=str(r), num_tokens=len(str(r).split()), finish_reason="stop"))
            out.append(row)
        return out


def teacher_from_spec(spec: str, *, tokenizer: str = "", temperature: float = 1.0, top_p: float = 0.95,
                      max_new_tokens: int = 4096, batch_size: int = 64, seed: int = 0) -> Teacher:
    """``ckpt:DIR`` (vt's sampler; needs ``tokenizer``) or ``openai:URL|MODEL[|API_KEY_ENV]``."""
    kind, _, rest = spec.partition(":")
    if kind == "ckpt":
        if not tokenizer:
            raise VtError(f"teacher {spec!r}: a checkpoint teacher needs --tokenizer DIR")
        gen = engine_generator(rest, tokenizer, SamplerConfig(temperature=temperature, top_p=top_p,
                                                              max_new_tokens=max_new_tokens, batch_size=batch_size))
        return as_teacher(gen, seed)
    if kind == "openai":
        parts = rest.split("|")
        if len(parts) not in (2, 3) or not all(parts[:2]):
            raise VtError(f"teacher {spec!r}: expected openai:URL|MODEL[|API_KEY_ENV]")
        return OpenAIChatJudge(parts[0], parts[1], api_key_env=parts[2] if len(parts) == 3 else None,
                               temperature=temperature, max_tokens=max_new_tokens)
    raise VtError(f"teacher {spec!r}: expected ckpt:DIR or openai:URL|MODEL[|API_KEY_ENV]")
