"""A vt export is a Hugging Face model as users load it: `AutoTokenizer.from_pretrained(dir)` gives vt's ids (the
demo's byte-level BPE and Qwen2.5's BPE; a SentencePiece model through `PreTrainedTokenizerFast`, since
transformers >= 5 builds any qwen2 model's tokenizer as Qwen2's byte-level BPE), `AutoModelForCausalLM
.from_pretrained(dir).generate` with no ids passed by hand gives vt's greedy text and stops at the end of a turn,
every file is sealed (vt reads its own export back), files follow the umask, and a model without a tokenizer is
exported only when asked."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from vt.cli import main
from vt.data.tokenizer import IM_END, TINY_CORPUS, _default_texts, build_tiny_sentencepiece, build_tiny_tokenizer, load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from qwen_helpers import qwen_dir  # noqa: E402,F401  (pytest fixture)


CHAT = [{"role": "user", "content": "Compute 17 * 3."}]


def texts_for(seed: int = 0) -> list[str]:
    """~100 texts: the demo's task corpus, the built-in corpus, chats, and random strings of awkward characters
    (bytes outside the vocabulary, specials inside text, runs of spaces, tabs, newlines)."""
    from vt.data.tasks import task_corpus
    rng = random.Random(seed)
    corpus = list(task_corpus(seed))
    texts = rng.sample(corpus, min(40, len(corpus))) + list(_default_texts())[:30]
    alphabet = "ab xyz 0123456789\n\t  \u00e9\u00df\u6570\u5b66\U0001f642{}\\$^_<|im_end|><think>"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(30)]
    return texts


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    """The demo's kind of tokenizer: SentencePiece BPE with byte fallback trained on the task corpus (512 pieces)."""
    from vt.data.tasks import task_corpus
    path = tmp_path_factory.mktemp("spm") / "tokenizer.model"
    build_tiny_sentencepiece(path, task_corpus(0), vocab_size=512)
    return path


@pytest.fixture(scope="module")
def demo_bpe(tmp_path_factory) -> Path:
    """The demo's tokenizer as its data stage builds it: a byte-level BPE directory in Qwen2's pipeline."""
    from vt.data.tasks import task_corpus
    path = tmp_path_factory.mktemp("bpe") / "tokenizer"
    build_tiny_tokenizer(path, task_corpus(0) + list(TINY_CORPUS), vocab_size=512)
    return path


@pytest.fixture(params=["demo-bpe", "qwen2.5", "spm"])
def tokenizer_path(request, spm_model, demo_bpe):
    return {"spm": spm_model, "demo-bpe": demo_bpe}.get(request.param) or request.getfixturevalue("qwen_dir")


def _checkpoint(tmp: Path, vocab_size: int, *, stop_after: int | None = None, tok=None) -> Path:
    """A random tiny model (untied head) of `vocab_size`, saved as a vt checkpoint. `stop_after` k: the head's
    columns of <|im_end|> and of the token vt's greedy decode emits at step k (no stops) are swapped, so greedy
    decoding ends the turn by step k: the test of `generate` stopping where vt's sampler stops."""
    import jax

    from vt.checkpoint.params import save_model
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    from vt.sharding import MeshConfig, make_mesh
    cfg = dataclasses.replace(preset("tiny"), vocab_size=vocab_size, tie_word_embeddings=False)
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    model = create_model(cfg, mesh, seed=0)
    if stop_after is not None:
        prompt = tok.encode_chat(CHAT, add_generation_prompt=True)
        ids = _vt_greedy(model, tok, [prompt], max_new_tokens=stop_after + 1, stop=())[0]
        end, t = tok.token_to_id(IM_END), ids[stop_after]
        if t != end:
            w = np.array(model.lm_head[...])
            w[:, [end, t]] = w[:, [t, end]]
            model.lm_head[...] = jax.numpy.asarray(w)
    save_model(tmp / "ck", model)
    return tmp / "ck"


def _vt_greedy(model, tok, prompts, max_new_tokens, stop=None):
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine
    sc = SamplerConfig(temperature=0.0, max_new_tokens=max_new_tokens, batch_size=8,
                       stop_token_ids=tuple(tok.eos_token_ids) if stop is None else tuple(stop))
    engine = Engine(model, sc, tokenizer=tok if stop is None else None)
    return [list(s[0].completion_ids) for s in engine.generate([Request(prompt_ids=p) for p in prompts], seed=0)]


def _modes(root: Path) -> set[tuple[str, int]]:
    out = {("dir", stat.S_IMODE(root.stat().st_mode))}
    for p in root.rglob("*"):
        out.add(("dir" if p.is_dir() else "file", stat.S_IMODE(p.stat().st_mode)))
    return out


def test_export_loads_in_transformers_as_users_load_it(tokenizer_path, tmp_path, capsys):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vt.checkpoint.params import load_model
    tok = load_tokenizer(tokenizer_path)
    ckpt = _checkpoint(tmp_path, tok.vocab_size if tok.vocab_size <= 512 else 151936, stop_after=3, tok=tok)
    old = os.umask(0o022)
    try:
        assert main(["convert", "orbax-to-hf", str(ckpt), str(tmp_path / "hf"), "--tokenizer", str(tokenizer_path)]) == 0
    finally:
        os.umask(old)
    printed = capsys.readouterr().out
    assert ("PreTrainedTokenizerFast.from_pretrained" in printed) == (tok.kind == "spm"), printed
    hf = tmp_path / "hf"
    assert _modes(hf) == {("dir", 0o755), ("file", 0o644)}, _modes(hf)

    # vt reads its own export back, sealed over every file (no --trust-checkpoint).
    assert main(["info", str(hf)]) == 0
    assert main(["convert", "hf-to-orbax", str(hf), str(tmp_path / "back")]) == 0
    capsys.readouterr()

    # The tokenizer: the same ids as vt's on ~100 texts, the chat template, the special tokens.
    if tok.kind == "spm" and int(transformers.__version__.split(".")[0]) >= 5:
        theirs = transformers.PreTrainedTokenizerFast.from_pretrained(str(hf))  # what the CLI tells the user
    else:
        theirs = AutoTokenizer.from_pretrained(str(hf))
    texts = texts_for()
    assert len(texts) >= 100
    for t in texts:
        assert theirs.encode(t, add_special_tokens=False) == tok.encode(t), t
        assert theirs.decode(tok.encode(t)) == tok.decode(tok.encode(t)), t
    chat = CHAT
    assert theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(chat, add_generation_prompt=True)
    end = tok.token_to_id(IM_END)
    assert theirs.eos_token_id == end and theirs.pad_token_id == tok.pad_token_id
    # vt's tokenizer of the export is the same tokenizer (--tokenizer takes the export's directory too).
    again = load_tokenizer(hf)
    assert all(again.encode(t) == tok.encode(t) for t in texts)
    assert again.eos_token_ids == tok.eos_token_ids and again.pad_token_id == tok.pad_token_id

    config = json.loads((hf / "config.json").read_text())
    gen = json.loads((hf / "generation_config.json").read_text())
    assert config["eos_token_id"] == end and config["pad_token_id"] == tok.pad_token_id
    assert set(gen["eos_token_id"]) == set(tok.eos_token_ids) and gen["pad_token_id"] == tok.pad_token_id

    # generate() with nothing passed by hand but greedy decoding: vt's greedy ids, ending at <|im_end|>.
    transformers.logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    inputs = theirs.apply_chat_template(chat, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == tok.encode_chat(chat, add_generation_prompt=True)
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=12)
    got = out[0, inputs["input_ids"].shape[1]:].tolist()
    ours = _vt_greedy(load_model(ckpt, dtype="float32"), tok, [inputs["input_ids"][0].tolist()], 12)[0]
    assert got == ours, (got, ours)
    assert got[-1] == end and len(got) <= 4  # stopped at the end of the turn (the head was made to end it)


def test_tokenizer_flag_takes_a_file_or_a_directory_and_none_only_when_asked(spm_model, tmp_path, capsys):
    from vt.data.tokenizer import save_hf_tokenizer
    ckpt = _checkpoint(tmp_path, 512)
    assert main(["convert", "orbax-to-hf", str(ckpt), str(tmp_path / "none")]) == 2
    assert "--tokenizer" in capsys.readouterr().err and not (tmp_path / "none").exists()
    save_hf_tokenizer(load_tokenizer(spm_model), tmp_path / "tokdir")  # the same tokenizer as a directory
    for i, arg in enumerate((spm_model, spm_model.parent, tmp_path / "tokdir")):
        if arg == spm_model.parent:  # a directory holding only a .model: vt names the file to pass
            assert main(["convert", "orbax-to-hf", str(ckpt), str(tmp_path / f"o{i}"), "--tokenizer", str(arg)]) == 2
            assert str(spm_model) in capsys.readouterr().err
            continue
        assert main(["convert", "orbax-to-hf", str(ckpt), str(tmp_path / f"o{i}"), "--tokenizer", str(arg)]) == 0
        assert (tmp_path / f"o{i}" / "tokenizer.json").is_file()
    assert (tmp_path / "o0" / "tokenizer.json").read_text() == (tmp_path / "o2" / "tokenizer.json").read_text()
    assert main(["convert", "orbax-to-hf", str(ckpt), str(tmp_path / "bare"), "--no-tokenizer"]) == 0
    assert not (tmp_path / "bare" / "tokenizer.json").exists()
    assert main(["info", str(tmp_path / "bare")]) == 0
    # A tokenizer larger than the model's vocabulary is not this model's.
    small = _checkpoint(tmp_path / "small", 300)
    capsys.readouterr()
    assert main(["convert", "orbax-to-hf", str(small), str(tmp_path / "x"), "--tokenizer", str(spm_model)]) == 2
    assert "more than the model's vocab_size" in capsys.readouterr().err
