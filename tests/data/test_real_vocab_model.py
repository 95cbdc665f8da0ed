"""A tiny model on Qwen2.5's real vocabulary (151936 embedding rows, hidden 32): `vt sample` stops on the Qwen
stop ids and decodes CJK, emoji and code split across tokens exactly as transformers does; exported checkpoints
carry the tokenizer files.

The model is built to greedily emit a chosen completion: its layers add nothing to the residual stream (zero
output projections), so the next token is a function of the current one only (a bigram table): token a's
embedding is a direction +-e_k and the LM-head row of its successor b is 10 * that direction, so b wins the argmax
by a wide margin (every other row is 0 or points the other way). Each chain's tokens are distinct.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from qwen_helpers import hf_chat, hf_encode, hf_qwen, qwen_dir, qwen_tok  # noqa: F401 (fixtures)
from testutil import run_vt

from vt.data.qwen_tokenizer import QWEN25_MODEL_VOCAB

HIDDEN = 32
# A completion with CJK, an emoji that is one token, a CJK character and an emoji ZWJ sequence split into
# byte tokens, and code; every token distinct (a bigram chain cannot repeat a token).
COMPLETION = '数学🙂 龘 def g(x):\n    return "👨\u200d👩" # 你好'
SECOND = "好的。"


def _chains(tok):
    first = [tok.encode("Q")[-1]] + tok.encode(COMPLETION) + [151645]  # ends the turn: <|im_end|>
    second = [tok.encode("R")[-1]] + tok.encode(SECOND) + [151643]  # ends the document: <|endoftext|>
    return first, second


@pytest.fixture(scope="module")
def chain_ckpt(qwen_tok, tmp_path_factory):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    chains = _chains(qwen_tok)
    tokens = [t for c in chains for t in c]
    assert len(set(tokens)) == len(tokens) and len(tokens) - len(chains) <= 2 * HIDDEN
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=QWEN25_MODEL_VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        head.zero_()
        k = 0
        for chain in chains:
            for a, b in zip(chain, chain[1:]):
                direction = torch.zeros(HIDDEN)
                direction[k % HIDDEN] = 1.0 if k < HIDDEN else -1.0
                emb[a], head[b] = direction, 10 * direction
                k += 1
    hf_dir = tmp_path_factory.mktemp("chain_hf")
    model.save_pretrained(hf_dir)
    ckpt = tmp_path_factory.mktemp("chain_ckpt") / "ck"
    run_vt("convert", "hf-to-orbax", str(hf_dir), str(ckpt), check=True)
    return ckpt


def test_vt_sample_stops_and_decodes_across_token_boundaries(chain_ckpt, qwen_dir, qwen_tok, hf_qwen, tmp_path):
    first, second = _chains(qwen_tok)
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": "Q"}) + "\n" + json.dumps({"prompt": "R"}) + "\n")
    proc = run_vt("sample", "--ckpt", str(chain_ckpt), "--tokenizer", str(qwen_dir), "--prompts",
                  str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out.jsonl"), "--temperature", "0",
                  "--max-new-tokens", "60", "--batch-size", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    # Both stop ids end a sample (the tokenizer's eos ids: <|endoftext|> and <|im_end|>), long before the limit.
    assert out[0]["completion_ids"] == first[1:] and out[0]["finish_reason"] == "stop"
    assert out[1]["completion_ids"] == second[1:] and out[1]["finish_reason"] == "stop"
    for rec, text in zip(out, (COMPLETION, SECOND)):
        ids = rec["completion_ids"]
        assert rec["completion"] == text == hf_qwen.decode(ids, skip_special_tokens=True)
        # Streamed token by token, the text never shows half a character.
        dec = qwen_tok.stream_decoder()
        pieces = [dec.push(np.int64(i)) for i in ids]  # one id at a time, as a sampler hands them out
        assert "".join(pieces) + dec.flush() == text and not any("\ufffd" in p for p in pieces)
    assert any("\ufffd" in hf_qwen.decode([i]) for i in first)  # the completion does split characters


def test_engine_stop_ids_are_the_tokenizers(chain_ckpt, qwen_dir, qwen_tok):
    from vt.checkpoint.params import load_model
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine

    gen = json.loads((qwen_dir / "generation_config.json").read_text())
    engine = Engine(load_model(chain_ckpt), SamplerConfig(batch_size=2, max_new_tokens=40, temperature=0.0),
                    tokenizer=qwen_tok)
    assert engine.stop_ids == (151643, 151645) == tuple(sorted(gen["eos_token_id"]))
    first, _ = _chains(qwen_tok)
    # A chat prompt ending in the chain's first token: the model answers with the chain and stops at <|im_end|>.
    prompt = qwen_tok.encode_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True) + first[:1]
    [[sample]] = engine.generate([Request(prompt_ids=prompt)])
    assert sample.completion_ids == first[1:] and sample.finish_reason == "stop" and sample.text == COMPLETION


def test_export_carries_the_tokenizer(chain_ckpt, qwen_dir, qwen_tok, hf_qwen, tmp_path):
    from transformers import AutoTokenizer

    from vt.data.tokenizer import load_tokenizer

    out = tmp_path / "hf"
    run_vt("convert", "orbax-to-hf", str(chain_ckpt), str(out), "--tokenizer", str(qwen_dir), "--dtype", "float32",
           check=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        assert (out / name).read_bytes() == (qwen_dir / name).read_bytes(), name
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == QWEN25_MODEL_VOCAB and 151645 in json.loads(
        (out / "generation_config.json").read_text())["eos_token_id"]
    exported, reloaded = AutoTokenizer.from_pretrained(str(out)), load_tokenizer(out)
    msgs = [{"role": "user", "content": "数学 🙂 def f(): pass"}, {"role": "assistant", "content": "<think>\nok\n</think>\n好"}]
    for text in ("Hello", COMPLETION, hf_chat(hf_qwen, msgs)):
        assert hf_encode(exported, text) == reloaded.encode(text) == qwen_tok.encode(text)
    assert hf_chat(exported, msgs) == reloaded.apply_chat_template(msgs) == qwen_tok.apply_chat_template(msgs)
    assert np.all(np.asarray(reloaded.eos_token_ids) == (151643, 151645))
