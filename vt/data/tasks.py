"""Built-in synthetic verifiable tasks: tiny-model stand-ins for the recipe's math/code/STEM/instruction data.

Every record has the shape the real data has (chat `messages`, `ground_truth` / `tests` / `constraints`), so
the same SFT pipeline, sampler, verifiers and RL learner run on them unchanged. They exist so that the whole
recipe can be exercised on a laptop CPU in minutes (`make demo`, the RL tests).

`noise` makes a deliberately imperfect SFT teacher: with that probability the assistant's answer is a wrong
one, so a model trained on it starts RL with a measurable, improvable accuracy.

Every answer starts with a `<think>` block, as VibeThinker's responses do. With a SentencePiece tokenizer
that matters: `<think>` is an atomic piece, so the tokens of the prompt (`...assistant\n`) are the same
whether or not an answer follows; an answer starting with plain text can merge with the prompt's last newline
into one piece (`\n*`), and the model would never see at inference the prompt tokens it was trained on.

Domains (each a `<domain>_record(index, seed, ...)` function; `with_answer=False` gives the prompt-only form
RL, profiling and evaluation read):
  - math (`math_record`: `a+b` -> `\\boxed{a+b}`; `arith_record`: the same with a worked step in `<think>`,
    in a short and a long form, so Long2Short has lengths to choose between);
  - code (`code_record`): "write f(x) returning x OP k", graded by call-based unit tests in the sandbox;
  - stem (`stem_record`): "which option is largest", a multiple-choice answer `\\boxed{B}`;
  - instruct (`instruct_record`): bullet lists under count and letter-case constraints (rule rewards).
`task_corpus()` is every text the tasks can produce (tokenizer training).
"""
from __future__ import annotations

import numpy as np

from vt.data.tokenizer import render_qwen_chat

SPLITS = {"train": 0, "eval": 1}
DOMAINS = ("math", "code", "stem", "instruct")


def _rng(seed: int, split: str, index: int, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, SPLITS[split], index, salt])


def math_record(index: int, seed: int, *, max_operand: int = 4, noise: float = 0.0, with_answer: bool = True,
                split: str = "train") -> dict:
    """`a+b` with a, b in [0, max_operand]; answer boxed: `\\boxed{a+b}`."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    a, b = (int(x) for x in rng.integers(0, max_operand + 1, 2))
    answer = a + b
    rec = {"id": f"math-{split}-{index}", "domain": "math",
           "messages": [{"role": "user", "content": f"{a}+{b}"}], "ground_truth": str(answer)}
    if with_answer:
        shown = answer
        if rng.random() < noise:
            shown = int(rng.choice([v for v in range(2 * max_operand + 1) if v != answer]))
        rec["messages"].append({"role": "assistant", "content": f"\\boxed{{{shown}}}"})
    return rec


def math_corpus(max_operand: int = 4) -> list[str]:
    """Every text the math task can produce: enough to train a tokenizer that covers it."""
    texts = []
    for a in range(max_operand + 1):
        for b in range(max_operand + 1):
            texts.append(f"{a}+{b}")
    texts += [f"\\boxed{{{v}}}" for v in range(2 * max_operand + 1)]
    return texts


# --- the demo's four domains --------------------------------------------------------------------------------

def _wrong(rng, right: int, lo: int, hi: int) -> int:
    return int(rng.choice([v for v in range(lo, hi + 1) if v != right]))


def arith_record(index: int, seed: int, *, max_operand: int = 6, noise: float = 0.0, with_answer: bool = True,
                 split: str = "train", long_frac: float = 0.5) -> dict:
    """`a+b` with a worked step: `<think>a+b=c</think>\\boxed{c}`; with probability `long_frac` the trace also
    checks the commuted sum (`<think>a+b=c. b+a=c</think>`): two correct paths of different lengths."""
    rng = _rng(seed, split, index, 1)
    a, b = (int(x) for x in rng.integers(0, max_operand + 1, 2))
    answer = a + b
    pid = f"math-{split}-{a}+{b}"
    rec = {"id": f"math-{split}-{index}", "domain": "math",
           "messages": [{"role": "user", "content": f"{a}+{b}"}], "ground_truth": str(answer)}
    if with_answer:
        rec["prompt_id"] = pid  # several traces of one query (multi-path); a prompt-only record is its own id
        shown = _wrong(rng, answer, 0, 2 * max_operand) if rng.random() < noise else answer
        step = f"{a}+{b}={shown}" + (f". {b}+{a}={shown}" if rng.random() < long_frac else "")
        rec["messages"].append({"role": "assistant", "content": f"<think>{step}</think>\\boxed{{{shown}}}"})
    return rec


CODE_OPS = ("+", "-", "*")


def code_record(index: int, seed: int, *, max_k: int = 5, noise: float = 0.0, with_answer: bool = True,
                split: str = "train") -> dict:
    """"f(x) returns x OP k": `<think>x+3</think>` then a Python function in a fenced block, graded by two
    call-based unit tests."""
    rng = _rng(seed, split, index, 2)
    op = CODE_OPS[int(rng.integers(len(CODE_OPS)))]
    k = int(rng.integers(1, max_k + 1))
    fn = {"+": lambda x: x + k, "-": lambda x: x - k, "*": lambda x: x * k}[op]
    xs = [int(x) for x in rng.integers(-9, 10, 2)]
    rec = {"id": f"code-{split}-{index}", "domain": "code",
           "messages": [{"role": "user", "content": f"Write f(x) that returns x{op}{k}."}],
           "tests": [{"fn_name": "f", "args": [x], "expected": fn(x)} for x in xs]}
    rec["metadata"] = {"tests": rec["tests"]}  # vt.data records keep reference fields under metadata
    if with_answer:
        rec["prompt_id"] = f"code-{split}-x{op}{k}"
        shown_op, shown_k = op, k
        if rng.random() < noise:
            if rng.random() < 0.5:
                shown_k = _wrong(rng, k, 1, max_k)
            else:
                shown_op = CODE_OPS[(CODE_OPS.index(op) + 1 + int(rng.integers(2))) % 3]
        body = f"<think>x{shown_op}{shown_k}</think>```python\ndef f(x):\n    return x{shown_op}{shown_k}\n```"
        rec["messages"].append({"role": "assistant", "content": body})
    return rec


OPTIONS = "ABCD"


def stem_record(index: int, seed: int, *, n_options: int = 3, noise: float = 0.0, with_answer: bool = True,
                split: str = "train") -> dict:
    """"Largest? (A) 3 (B) 7 (C) 5" -> `<think>7</think>\\boxed{B}`: option matching, as in GPQA."""
    rng = _rng(seed, split, index, 3)
    values = [int(v) for v in rng.choice(10, size=n_options, replace=False)]
    right = int(np.argmax(values))
    opts = " ".join(f"({OPTIONS[i]}) {v}" for i, v in enumerate(values))
    rec = {"id": f"stem-{split}-{index}", "domain": "stem", "prompt_id": f"stem-{split}-{index}",
           "messages": [{"role": "user", "content": f"Largest? {opts}"}], "ground_truth": OPTIONS[right]}
    if with_answer:
        pick = _wrong(rng, right, 0, n_options - 1) if rng.random() < noise else right
        rec["messages"].append({"role": "assistant",
                                "content": f"<think>{values[pick]}</think>\\boxed{{{OPTIONS[pick]}}}"})
    return rec


WORDS = {"colors": ("red", "blue", "green", "pink", "gray"), "animals": ("cat", "dog", "cow", "owl", "fox"),
         "fruits": ("fig", "lime", "pear", "plum", "kiwi")}


def instruct_record(index: int, seed: int, *, max_items: int = 3, noise: float = 0.0, with_answer: bool = True,
                    split: str = "train") -> dict:
    """"List 2 animals as bullets in uppercase." -> `<think>2 u</think>* CAT\\n* OWL`: item count and letter case,
    checked by the instruction-following reward (partial credit: the fraction of the two constraints met)."""
    rng = _rng(seed, split, index, 4)
    topic = sorted(WORDS)[int(rng.integers(len(WORDS)))]
    n = int(rng.integers(1, max_items + 1))
    case = ("uppercase", "lowercase")[int(rng.integers(2))]
    rec = {"id": f"instruct-{split}-{index}", "domain": "instruct", "prompt_id": f"instruct-{split}-{index}",
           "messages": [{"role": "user", "content": f"List {n} {topic} as bullets in {case}."}],
           "constraints": [{"type": "bullets", "num": n}, {"type": f"all_{case}"}]}
    rec["metadata"] = {"constraints": rec["constraints"]}
    if with_answer:
        shown_n, shown_case = n, case
        if rng.random() < noise:
            if rng.random() < 0.5:
                shown_n = _wrong(rng, n, 1, max_items)
            else:
                shown_case = "lowercase" if case == "uppercase" else "uppercase"
        words = [str(w) for w in rng.choice(WORDS[topic], size=shown_n, replace=False)]
        words = [w.upper() if shown_case == "uppercase" else w for w in words]
        plan = f"{shown_n} {shown_case[0]}"
        rec["messages"].append({"role": "assistant",
                                "content": f"<think>{plan}</think>" + "\n".join(f"* {w}" for w in words)})
    return rec


TOOL_SYSTEM = "Use the python tool."


def tool_call(code: str) -> dict:
    """An assistant turn calling the `python` tool (vt.tools) on `code`, in the chat format's tool_calls."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]}


def tool_record(index: int, seed: int, *, digits: int = 2, noise: float = 0.0, with_answer: bool = True,
                split: str = "train") -> dict:
    """`a*b` of two `digits`-digit numbers -> `\\boxed{a*b}`: a product the tiny model cannot work out in its head
    but can copy from the `python` tool's output (the demo's tools variant; graded by the math verifier; 2 digits:
    800 SFT steps copy every digit of 0.80 of held-out traces, teacher-forced, where 3 digits reach 0.36). The SFT
    trace calls the tool (`print(a*b)`), reads its output in a `tool` turn and boxes it; with probability
    `noise` it answers at once with a guess instead (wrong), so RL has both behaviours to choose between. Chat
    templates that render tool turns (Qwen2.5's) write it as vt's sampler does (vt.tools.format)."""
    rng = _rng(seed, split, index, 5)
    a, b = (int(x) for x in rng.integers(10 ** (digits - 1), 10 ** digits, 2))
    rec = {"id": f"tools-{split}-{index}", "domain": "math", "ground_truth": str(a * b),
           "messages": [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": f"{a}*{b}"}]}
    if with_answer:
        if rng.random() < noise:
            guess = int(rng.integers(10 ** (2 * digits - 2), 10 ** (2 * digits)))
            guess += guess == a * b  # a guess: wrong
            rec["messages"].append({"role": "assistant", "content": f"\\boxed{{{guess}}}"})
        else:
            rec["messages"] += [tool_call(f"print({a}*{b})"), {"role": "tool", "content": str(a * b)},
                                {"role": "assistant", "content": f"\\boxed{{{a * b}}}"}]
    return rec


def tool_corpus(seed: int, n: int) -> list[str]:
    """Texts of the tool task as Qwen2.5's template renders them (tokenizer training)."""
    texts = []
    for rec in (tool_record(i, seed, noise=0.5) for i in range(n)):
        m = rec["messages"]
        text = f"<|im_start|>system\n{m[0]['content']}<|im_end|>\n<|im_start|>user\n{m[1]['content']}<|im_end|>\n"
        if len(m) > 3:
            code = m[2]["tool_calls"][0]["function"]["arguments"]["code"]
            text += (f'<|im_start|>assistant\n<tool_call>\n{{"name": "python", "arguments": {{"code": "{code}"}}}}\n'
                     f"</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{m[3]['content']}\n</tool_response>"
                     "<|im_end|>\n")
        texts.append(text + f"<|im_start|>assistant\n{m[-1]['content']}<|im_end|>\n")
    return texts


RECORD_FNS = {"math": arith_record, "code": code_record, "stem": stem_record, "instruct": instruct_record,
              "tools": tool_record}


def task_records(domain: str, n: int, seed: int, *, split: str = "train", noise: float = 0.0,
                 with_answer: bool = True, start: int = 0) -> list[dict]:
    return [RECORD_FNS[domain](start + i, seed, noise=noise, with_answer=with_answer, split=split)
            for i in range(n)]


def task_corpus(seed: int = 0, n_per_domain: int = 200, domains: tuple[str, ...] = DOMAINS) -> list[str]:
    """Chat texts of `domains` (answers right and wrong): enough to train a tokenizer that covers them."""
    texts = []
    for d in domains:
        if d == "tools":
            texts += tool_corpus(seed, n_per_domain)
            continue
        for rec in task_records(d, n_per_domain, seed, noise=0.5):
            texts.append(render_qwen_chat(rec["messages"]))
    return texts
