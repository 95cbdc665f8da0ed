"""`vt sample`: greedy parity with transformers' generate, the text/chat paths, and bad input."""
import json

import numpy as np
import pytest
import torch

from testutil import run_vt
from vt import VtError
from vt.cli import main


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_greedy_matches_transformers_generate(sampling_hf_dir, sampling_ckpt, tmp_path):
    from transformers import AutoModelForCausalLM
    rng = np.random.RandomState(0)
    prompts = [rng.randint(0, 300, n).tolist() for n in (5, 17, 1, 33, 9)]
    _write(tmp_path / "in.jsonl", [{"prompt_ids": p} for p in prompts])
    # 3 slots for 10 samples: slot refill is on the path. Pages of 4 tokens: every sample crosses page
    # boundaries and its 2 samples share a prompt's full pages (and copy its partly filled last one). A pool of
    # 40 pages (a 97-token sample needs 25) makes samples wait for pages or be preempted.
    proc = run_vt("sample", "--ckpt", str(sampling_ckpt), "--prompts", str(tmp_path / "in.jsonl"), "--out",
                  str(tmp_path / "out.jsonl"), "--temperature", "0", "--max-new-tokens", "64", "--batch-size", "3",
                  "--n", "2", "--page-size", "4", "--kv-pages", "40", "--stats-json", str(tmp_path / "stats.json"))
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s" in proc.stderr
    out = _read(tmp_path / "out.jsonl")
    assert [(r["index"], r["sample"]) for r in out] == [(i, j) for i in range(5) for j in range(2)]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["tokens"] == 640 and stats["prefill_tokens"] >= sum(map(len, prompts)), stats
    assert stats["pool_pages"] == 40 and 0 < stats["peak_pages"] <= 40 and stats["decode_steps"] >= 64, stats
    assert {"preemptions", "prefill_seconds", "decode_seconds", "host_seconds"} <= set(stats), stats

    hf = AutoModelForCausalLM.from_pretrained(sampling_hf_dir, dtype=torch.float32).eval()
    for p, rec in zip([p for p in prompts for _ in range(2)], out):
        with torch.no_grad():
            ids = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              do_sample=False, max_new_tokens=64, eos_token_id=None, pad_token_id=0)
        assert rec["prompt_ids"] == p
        assert rec["completion_ids"] == ids[0, len(p):].tolist()
        assert rec["finish_reason"] == "length" and rec["logprobs"] == [0.0] * 64
        assert "completion" not in rec


@pytest.fixture(scope="module")
def text_setup(tmp_path_factory):
    """A vocab-512 vt checkpoint and the tiny tokenizer (<= 512 ids, Qwen specials included)."""
    from vt.checkpoint.params import save_model
    from vt.data.tokenizer import build_tiny_tokenizer
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    root = tmp_path_factory.mktemp("text")
    tok = build_tiny_tokenizer(root / "tok")
    save_model(root / "ck", create_model(preset("tiny", max_position_embeddings=128), seed=2))
    return root, tok


def test_text_and_chat_prompts(text_setup, tmp_path):
    root, tok = text_setup
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    _write(tmp_path / "in.jsonl", [{"prompt": "def add(a, b):", "max_new_tokens": 5},
                                   "", {"messages": messages, "n": 2}])
    rc = main(["sample", "--ckpt", str(root / "ck"), "--prompts", str(tmp_path / "in.jsonl"), "--out",
               str(tmp_path / "out.jsonl"), "--tokenizer", str(root / "tok"), "--temperature", "1.0", "--top-k", "20",
               "--max-new-tokens", "12", "--seed", "3", "--no-progress"])
    assert rc == 0
    out = _read(tmp_path / "out.jsonl")
    assert [(r["index"], r["sample"]) for r in out] == [(0, 0), (1, 0), (1, 1)]
    assert out[0]["prompt_ids"] == tok.encode("def add(a, b):")
    assert out[1]["prompt_ids"] == tok.encode_chat(messages, add_generation_prompt=True)
    for r in out:
        assert r["completion"] == tok.decode(r["completion_ids"], skip_special_tokens=True)
        assert len(r["logprobs"]) == len(r["completion_ids"]) and all(lp <= 0 for lp in r["logprobs"])
        stop_ids = set(tok.eos_token_ids)
        ended = bool(r["completion_ids"]) and r["completion_ids"][-1] in stop_ids
        assert r["finish_reason"] == ("stop" if ended else "length")
    assert len(out[0]["completion_ids"]) <= 5 and len(out[1]["completion_ids"]) <= 12


BAD = [
    ({"prompt_ids": []}, "line 2: field 'prompt_ids': empty prompt"),
    ({"prompt_ids": list(range(5)) * 60}, "line 2: field 'prompt_ids': prompt has 300 tokens"),
    ({"prompt_ids": [1, 300]}, "line 2: field 'prompt_ids': token id 300 is out of the vocabulary"),
    ({"prompt_ids": [1, "a"]}, "line 2: field 'prompt_ids': prompt ids must be a list of integers"),
    ({"prompt_ids": [1], "temperature": 0.5}, "line 2: unknown field(s) ['temperature']"),
    ('{"prompt_ids": [1, 2]', "line 2: invalid JSON"),
    ({"prompt": "hello"}, "line 2: field 'prompt' needs --tokenizer"),
    ({"prompt_ids": [1], "prompt": "x"}, "line 2: expected exactly one of"),
    ({"prompt_ids": [1], "max_new_tokens": 0}, "line 2: field 'max_new_tokens' must be a positive integer"),
    ([1, 2], "line 2: expected a JSON object"),
]


@pytest.mark.parametrize("record,message", BAD, ids=[m.split(": ", 1)[1][:30] for _, m in BAD])
def test_bad_input_names_the_line_and_keeps_out(record, message, sampling_ckpt, tmp_path, capsys):
    _write(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2, 3]}, record])
    out = tmp_path / "out.jsonl"
    out.write_text("precious\n")
    rc = main(["sample", "--ckpt", str(sampling_ckpt), "--prompts", str(tmp_path / "in.jsonl"), "--out", str(out),
               "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and str(tmp_path / "in.jsonl") in err, err
    assert len(err.strip().splitlines()) == 1
    assert out.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_bad_flags_and_missing_files(sampling_ckpt, tmp_path, capsys):
    _write(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2, 3]}])
    base = ["sample", "--ckpt", str(sampling_ckpt), "--prompts", str(tmp_path / "in.jsonl"), "--out",
            str(tmp_path / "out.jsonl"), "--no-progress"]
    for extra, message in [(["--top-p", "0"], "--top-p"), (["--top-k", "0"], "--top-k"),
                           (["--batch-size", "0"], "--batch-size"),
                           (["--decode-attention", "triton"], "--decode-attention"),
                           (["--stop", "x"], "--stop needs --tokenizer")]:
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err
    assert main(base[:4] + [str(tmp_path / "missing.jsonl")] + base[5:]) == 2
    assert "no such prompts file" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("extra,record,message", [
    (["--batch-size", "10000000"], {"prompt_ids": [1, 2, 3]}, "--batch-size 10000000: the KV cache"),
    ([], {"prompt_ids": [1, 2, 3], "n": 100_000_000}, "in.jsonl line 1: n=100000000"),
    (["--n", "100000000"], {"prompt_ids": [1, 2, 3]}, "--n 100000000"),
], ids=["batch-size", "record-n", "flag-n"])
def test_work_too_large_for_memory_is_refused_before_allocating(extra, record, message, sampling_ckpt, tmp_path,
                                                                 capsys):
    # Issue 16: --batch-size 10000000 brought the out-of-memory killer; "n": 1e8 grew memory ~170 MB/s.
    _write(tmp_path / "in.jsonl", [record])
    rc = main(["sample", "--ckpt", str(sampling_ckpt), "--prompts", str(tmp_path / "in.jsonl"), "--out",
               str(tmp_path / "out.jsonl"), "--no-progress", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out.jsonl").exists()


def test_engine_refuses_a_batch_too_large_for_memory_before_allocating(sampling_model):
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine
    engine = Engine(sampling_model, SamplerConfig(batch_size=10_000_000, max_new_tokens=8))
    with pytest.raises(VtError, match="sampler batch_size 10000000: the KV cache"):
        engine.generate([Request(prompt_ids=[1, 2, 3])])
    engine = Engine(sampling_model, SamplerConfig(batch_size=4, max_new_tokens=200))
    with pytest.raises(VtError, match="request 1: n=100000000"):
        engine.generate([Request(prompt_ids=[1, 2]), Request(prompt_ids=[1, 2, 3], n=100_000_000)])
    assert engine.compile_count == 0  # refused before any program ran
