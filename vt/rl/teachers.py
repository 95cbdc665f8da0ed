"""OPD's teachers (vt.rl.opd): per-token log-probs (at temperature 1: the teacher's own distribution) of given
completions after given prompts, behind one interface (`Teacher`):

    CheckpointTeacher   a vt checkpoint, bf16, parameters only (no optimiser state), on the job's mesh, scored by
                        the RL learner's token_logps program over build_rows' packed rows
    EndpointTeacher     an OpenAI-compatible server's prompt log-probs: /v1/completions with echo and logprobs,
                        as vLLM and SGLang serve them

`make_teacher` refuses a teacher whose vocabulary differs from the student's before the run starts.
`StreamingTeacher` scores completions as the sampler finishes them, beside decoding
(vt.rl.rollouts.rollout_and_score), as the streaming verifiers do.
"""
from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Protocol, Sequence

import jax
import numpy as np

from vt import VtError
from vt.buckets import bucket
from vt.checkpoint.params import flat_params, load_model, load_model_config
from vt.rl.opd import OpdConfig, completion_slots
from vt.rl.rollouts import ROW_BUCKET, Scored, build_rows
from vt.rl.step import make_token_logps, row_sharding
from vt.sampling.engine import Sample
from vt.train.state import ModelDef

# Text whose ids the student's tokenizer and an endpoint teacher's must agree on (vLLM's /tokenize).
PROBE = "On-policy distillation: 12 + 30 = \\boxed{42}.\n"


class Teacher(Protocol):
    def logprobs(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """log p_teacher(completion_t | prompt, completion_<t) per completion token, one array per pair."""

    def close(self) -> None: ...


class CheckpointTeacher:
    """A vt checkpoint's log-probs on `mesh` (the learner's, or this process's on several), parameters only, in `dtype`, through
    the RL learner's token_logps program over packed rows (vt.rl.rollouts.build_rows)."""

    def __init__(self, path: str, mesh, dtype: str = "bfloat16", batch: int = 16):
        model = load_model(path, mesh, param_dtype=dtype, dtype=dtype)
        self.path, self.model_cfg, self.mesh, self.batch = path, model.cfg, mesh, batch
        self.params = flat_params(model)
        md = ModelDef(model.cfg)
        self.program = make_token_logps(md, md.param_shardings(mesh), mesh, temperature=1.0)
        self.row_sh = row_sharding(mesh)
        # The largest (rows, row length) a call has padded to: every call pads to at least it, so the program
        # compiles when a call needs more (a few times, early) and not for each new mix of lengths a streamed
        # batch of completions brings (each a compile: seconds on CPU, inside the rollout's span)
        self.shape = (0, 0)

    @property
    def vocab_size(self) -> int:
        return self.model_cfg.vocab_size

    def logprobs(self, prompts, completions) -> list[np.ndarray]:
        n = len(prompts)
        if not n:
            return []
        zeros = np.zeros((n, 1))
        # Each pair a group of one: build_rows packs them as the learner's rows are packed.
        s = Scored([list(p) for p in prompts], [[Sample(list(c), [0.0] * len(c), "stop")] for c in completions],
                   zeros.astype(bool), zeros.astype(np.float32), zeros.astype(bool), zeros.astype(np.int64),
                   zeros.astype(bool), [""] * n)
        max_len = self.model_cfg.max_position_embeddings
        longest = max(len(p) + len(c) - 1 for p, c in zip(prompts, completions))
        T = max(min(bucket(longest, ROW_BUCKET, half_octaves=True), max_len), self.shape[1])
        rows = build_rows(s, T, pack=True)
        shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        W = max(shards * bucket(-(-len(rows["input_ids"]) // shards)), self.shape[0])
        self.shape = (W, T)
        inputs = {k: np.concatenate([rows[k], np.zeros((W - len(rows[k]), T), rows[k].dtype)])
                  for k in ("input_ids", "targets", "positions", "segment_ids")}
        # device_put, not global_batch: on several processes the teacher's mesh is this process's (each scores
        # its own samples, when they finish)
        logp = np.asarray(self.program(self.params, jax.device_put(inputs, self.row_sh)))[:len(rows["input_ids"])]
        sample, j = completion_slots(rows, np.array([len(p) for p in prompts]))
        lengths = np.array([len(c) for c in completions])
        starts = np.concatenate([[0], np.cumsum(lengths)])
        at = (j >= 0) & (j < lengths[np.maximum(sample, 0)])  # completions cut at the context hold no more
        flat = np.zeros(starts[-1], np.float32)
        flat[starts[sample[at]] + j[at]] = logp[at]
        return np.split(flat, starts[1:-1])

    def close(self) -> None:
        pass


class EndpointTeacher:
    """An OpenAI-compatible server's prompt log-probs: POST /v1/completions with the token ids as the prompt,
    echo=True, logprobs=0, max_tokens=1 (vLLM and SGLang return each prompt token's log-prob, the first None);
    the completion's are the entries after the prompt's. Its tokenizer is checked at start: the server's
    /tokenize of PROBE must equal the student's ids."""

    def __init__(self, url: str, tokenizer, tokenizer_path: str, model: str = "", timeout_s: float = 120.0,
                 retries: int = 3):
        base = url.rstrip("/")
        self.base = base[:-3] if base.endswith("/v1") else base
        self.model, self.timeout_s, self.retries = model, timeout_s, retries
        mine = tokenizer.encode(PROBE)
        try:
            theirs = self._post("/tokenize", {"prompt": PROBE, "add_special_tokens": False,
                                              **({"model": model} if model else {})})["tokens"]
        except (KeyError, TypeError) as e:
            raise VtError(f"opd.teacher={url}: malformed /tokenize response ({type(e).__name__})") from None
        if list(theirs) != list(mine):
            raise VtError(f"opd.teacher={url}: its tokenizer ({len(theirs)} ids for the probe text, "
                          f"first {list(theirs)[:6]}) differs from data.tokenizer={tokenizer_path} (vocab "
                          f"{tokenizer.vocab_size}; {len(mine)} ids, first {mine[:6]}): a teacher must share the "
                          f"student's vocabulary")

    def _post(self, path: str, body: dict) -> dict:
        data, last = json.dumps(body).encode(), ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(2.0 ** attempt, 30.0))
            try:
                req = urllib.request.Request(self.base + path, data=data, method="POST",
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
                if e.code < 500 and e.code != 429:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, ValueError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        raise VtError(f"opd.teacher={self.base}{path}: {last}")

    def logprobs(self, prompts, completions) -> list[np.ndarray]:
        if not len(prompts):
            return []
        body = {"prompt": [list(map(int, p)) + list(map(int, c)) for p, c in zip(prompts, completions)],
                "max_tokens": 1, "echo": True, "logprobs": 0, "temperature": 1.0,
                **({"model": self.model} if self.model else {})}
        choices = sorted(self._post("/v1/completions", body)["choices"], key=lambda c: c["index"])
        out = []
        for p, c, ch in zip(prompts, completions, choices):
            lp = ch["logprobs"]["token_logprobs"][len(p):len(p) + len(c)]
            if len(lp) != len(c) or any(v is None for v in lp):
                raise VtError(f"opd.teacher={self.base}: {len(lp)} completion log-probs for {len(c)} tokens")
            out.append(np.asarray(lp, np.float32))
        return out

    def close(self) -> None:
        pass


def make_teacher(cfg: OpdConfig, student_cfg, mesh, tokenizer, tokenizer_path: str) -> Teacher:
    """The teacher `cfg.teacher` names, checked against the student (vocabulary) before any work."""
    if cfg.teacher.startswith(("http://", "https://")):
        return EndpointTeacher(cfg.teacher, tokenizer, tokenizer_path, cfg.teacher_model, cfg.timeout_s)
    teacher_cfg = load_model_config(cfg.teacher)
    if teacher_cfg.vocab_size != student_cfg.vocab_size:
        raise VtError(f"opd.teacher={cfg.teacher}: vocab_size {teacher_cfg.vocab_size}, but the student's is "
                      f"{student_cfg.vocab_size} (data.tokenizer={tokenizer_path}): a teacher must share the "
                      f"student's vocabulary")
    return CheckpointTeacher(cfg.teacher, mesh, cfg.teacher_dtype, cfg.teacher_batch)


class StreamingTeacher:
    """Teacher log-probs of completions submitted one by one (as the sampler finishes them), scored on a thread
    of its own in batches of up to `batch` (what has queued up while the last batch was scored), beside
    decoding. `results()` waits for the last; `spans` and `tokens` time the scoring."""

    def __init__(self, teacher: Teacher, batch: int, count: int):
        self.teacher, self.batch = teacher, batch
        self.out: list[np.ndarray | None] = [None] * count
        self.spans: list[tuple[float, float]] = []
        self.tokens = 0
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="vt-opd-teacher")
        self._thread.start()

    def submit(self, index: int, prompt: Sequence[int], completion: Sequence[int]) -> None:
        self._queue.put((index, prompt, completion))

    def _run(self) -> None:
        done = False
        while not done:
            items = [self._queue.get()]
            while len(items) < self.batch:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = any(x is None for x in items)
            items = [x for x in items if x is not None and len(x[2])]
            if not items or self._error is not None:
                continue
            start = time.perf_counter()
            try:
                lps = self.teacher.logprobs([x[1] for x in items], [x[2] for x in items])
            except BaseException as e:  # noqa: BLE001 - raised by results(), in the rollout's thread
                self._error = e
                continue
            for (i, _, c), lp in zip(items, lps):
                self.out[i] = lp
            self.tokens += sum(len(x[2]) for x in items)
            self.spans.append((start, time.perf_counter()))

    def results(self) -> list[np.ndarray]:
        self.close()
        if self._error is not None:
            raise self._error
        return [np.zeros(0, np.float32) if x is None else x for x in self.out]

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> "StreamingTeacher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
