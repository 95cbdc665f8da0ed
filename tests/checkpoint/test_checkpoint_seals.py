"""Issue 16 item 8: every checkpoint vt writes is sealed, every command that reads one verifies it (a flipped bit
is exit 2 naming the file, nothing written), and --trust-checkpoint skips the check."""
import json
import shutil

import pytest

from vt.checkpoint.seal import CHECKSUM_FILE, verify_seal
from vt.cli import main


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    """A model checkpoint (save_model), its HF export, that export converted back, and a merge: all via the CLI."""
    from vt.checkpoint.params import save_model
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    root = tmp_path_factory.mktemp("seal")
    save_model(root / "ck", create_model(preset("tiny", max_position_embeddings=128), seed=0))
    assert main(["convert", "orbax-to-hf", str(root / "ck"), str(root / "hf"), "--dtype", "float32", "--no-tokenizer"]) == 0
    assert main(["convert", "hf-to-orbax", str(root / "hf"), str(root / "ck2")]) == 0
    assert main(["merge", str(root / "ck"), str(root / "ck2"), "--out", str(root / "merged")]) == 0
    return root


def _flip(directory, under=""):
    victim = max((p for p in (directory / under).rglob("*") if p.is_file() and p.name != CHECKSUM_FILE),
                 key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    return victim


def test_every_writer_seals(sealed):
    for name in ("ck", "hf", "ck2", "merged"):
        record = json.loads((sealed / name / CHECKSUM_FILE).read_text())
        assert record["algorithm"] == "sha256" and record["files"], name
        verify_seal(sealed / name, name)
    assert any(k.endswith(".safetensors") for k in json.loads((sealed / "hf" / CHECKSUM_FILE).read_text())["files"])


def test_every_reader_refuses_a_flipped_bit(sealed, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(sealed / "ck", bad)
    victim = _flip(bad, "params")
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt_ids": [1, 2, 3]}) + "\n")
    commands = {
        "info": ["info", str(bad)],
        "convert": ["convert", "orbax-to-hf", str(bad), str(tmp_path / "o_hf"), "--no-tokenizer"],
        "merge": ["merge", str(bad), str(sealed / "ck"), "--out", str(tmp_path / "o_merged")],
        "sample": ["sample", "--ckpt", str(bad), "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl"),
                   "--max-new-tokens", "2"],
        "eval": ["eval", "--config", "configs/eval_aime25.py:smoke", "--ckpt", str(bad), "--out",
                 str(tmp_path / "o_eval")],
    }
    for name, argv in commands.items():
        capsys.readouterr()
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert f"{victim}: checksum mismatch" in err and len(err.splitlines()) == 1, (name, err)
    assert not any((tmp_path / n).exists() for n in ("o_hf", "o_merged", "o.jsonl"))
    # Trusted storage: the flag skips the check (info reads metadata only, so it succeeds).
    assert main(["info", str(bad), "--trust-checkpoint"]) == 0
    assert main(["info", str(bad)]) == 2  # the flag lasts one command


def test_a_flipped_export_is_refused(sealed, tmp_path, capsys):
    bad = tmp_path / "hf"
    shutil.copytree(sealed / "hf", bad)
    victim = _flip(bad)
    for argv in (["info", str(bad)], ["convert", "hf-to-orbax", str(bad), str(tmp_path / "o")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        assert f"{victim}: checksum mismatch" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_truncated_file_is_one_clean_line_even_unverified(sealed, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(sealed / "ck", bad)
    victim = max((p for p in (bad / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    assert main(["convert", "orbax-to-hf", str(bad), str(tmp_path / "a"), "--no-tokenizer"]) == 2
    assert f"{victim}: checksum mismatch" in capsys.readouterr().err
    assert main(["convert", "orbax-to-hf", str(bad), str(tmp_path / "b"), "--trust-checkpoint", "--no-tokenizer"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot restore" in err and "pybind11" not in err and len(err.splitlines()) == 1, err


def test_a_deleted_seal_is_refused_at_resume_unless_trusted(tmp_path, capsys):
    """Issue 23 item 6: a committed step whose seal was deleted was re-sealed as good at resume, whatever its files
    held. Now the resume is refused in one line (the step is left as it is); --trust-checkpoint accepts it."""
    from vt.checkpoint.seal import set_verify
    work = tmp_path / "w"
    train = ["train", "--config", "configs/sft_stage1.py:smoke", "--workdir", str(work), "--config.train.progress=False",
             "--config.train.eval_every=0", "--config.checkpoint.every=1"]
    try:
        assert main([*train, "--config.train.steps=2"]) == 0
        step = work / "checkpoints" / "2"
        (step / CHECKSUM_FILE).unlink()
        before = {p: p.read_bytes() for p in step.rglob("*") if p.is_file()}
        capsys.readouterr()
        assert main([*train, "--config.train.steps=3"]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and f"checkpoint step 2 ({step}): committed but not sealed" in err[0], err
        assert "--trust-checkpoint" in err[0]
        assert {p: p.read_bytes() for p in step.rglob("*") if p.is_file()} == before  # not re-sealed
        assert main([*train, "--config.train.steps=3", "--trust-checkpoint"]) == 0
        lines = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in lines] == [1, 2, 3]  # resumed from the trusted step 2
        verify_seal(step, "step 2")  # accepted, and sealed as it was
    finally:
        set_verify(True)
