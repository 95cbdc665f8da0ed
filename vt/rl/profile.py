"""Pass-rate profiling: k samples per prompt from a checkpoint, verified; one JSON line per prompt id.

    {"id": "<prompt id>", "pass_rate": c / n, "n": n, "verifier_errors": e, "k": k}

The SFT stage-2 filter (vt.data.curriculum.load_pass_rates) and the RL learner's `data.profile` (drop prompts at
exactly 0 or 1) read this file. Profiling appends as it goes and skips ids already in the file, so a killed run
resumes where it stopped. n counts only samples the verifier could judge. A resume must use the same k as the
lines already there (rates from different k would be mixed in one file).
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vt import VtError
from vt.checkpoint.params import load_model
from vt.data.tokenizer import load_tokenizer
from vt.distributed import process_mesh
from vt.rewards.registry import make_reward
from vt.rl.rollouts import load_records, rollout_and_score
from vt.sampling.config import SamplerConfig
from vt.sampling.engine import Engine
from vt.sharding import MeshConfig

log = logging.getLogger(__name__)


def done_ids(out: Path, k: int | None = None) -> set[str]:
    """Ids already profiled in ``out``; VtError if a line was written with another k than ``k``."""
    if not out.is_file():
        return set()
    ids = set()
    for i, line in enumerate(out.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            ids.add(str(obj["id"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise VtError(f"{out}:{i}: not a profile line (a JSON object with 'id'); refusing to append") from None
        if k is not None and obj.get("k", k) != k:
            raise VtError(f"--k {k}: {out} was profiled with k={obj['k']} (line {i}); resume with --k {obj['k']} "
                          "or write to a new --out")
    return ids


def profile(ckpt: Path, tokenizer_path: Path, data: str, out: Path, sampler: SamplerConfig, *, k: int = 8,
            domain: str = "", prompts_per_call: int = 64, max_prompt_tokens: int = 4096, mesh: MeshConfig | None = None,
            progress: bool = True) -> int:
    """Profile every prompt of `data` not yet in `out` with `sampler` (its seed keys each call's; `n` is k);
    returns how many were added. `mesh`: the sampler's mesh over this process's devices (vt.distributed.process_mesh,
    as the RL learner's sampler), else one device."""
    out = Path(out)
    seen = done_ids(out, k)
    records = [r for r in load_records(data, "--data") if str(r.prompt_id) not in seen]
    if not records:
        return 0
    tokenizer = load_tokenizer(tokenizer_path)
    jax_mesh = process_mesh(mesh) if mesh is not None else None
    engine = Engine(load_model(ckpt, jax_mesh), sampler, mesh=jax_mesh, tokenizer=tokenizer)
    domains = {domain} if domain else {r.domain for r in records}
    rewards = {d: make_reward(d) for d in domains}
    bar = None
    if progress:
        bar = tqdm(total=len(records), desc="profile", dynamic_ncols=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(out, "a") as f:
            for start in range(0, len(records), prompts_per_call):
                chunk = records[start:start + prompts_per_call]
                # The seed depends on the chunk's first prompt, not its position, so a resumed run samples
                # each prompt exactly as a straight run would have.
                digest = hashlib.sha256(str(chunk[0].prompt_id).encode()).digest()
                key = [sampler.seed, int.from_bytes(digest[:4], "little")]
                call_seed = int(np.random.default_rng(key).integers(1 << 31))
                s = rollout_and_score(engine, tokenizer, chunk, rewards, group_size=k, seed=call_seed,
                                      max_prompt_tokens=max_prompt_tokens, domain=domain)
                for q, r in enumerate(chunk):
                    n = int(s.valid[q].sum())
                    if n == 0:  # no verdict at all: leave it out, so a later run profiles it again
                        log.warning("prompt %s: all %d samples hit verifier errors; not recorded", r.prompt_id, k)
                        continue
                    rate = float(s.correct[q].sum() / n)
                    f.write(json.dumps({"id": str(r.prompt_id), "pass_rate": rate, "n": n,
                                        "verifier_errors": int(k - n), "k": k}) + "\n")
                f.flush()
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
        for fn in rewards.values():
            fn.close()
        engine.close()
    return len(records)
