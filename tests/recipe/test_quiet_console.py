"""A quiet console: what `vt train` prints for a tiny SFT run and an RL run started from one of its step checkpoints
(a restore of a learner's params item, math-verify worker processes started from a JAX process) holds no absl
warning (Orbax's metadata warning among them) and no fork RuntimeWarning; so does a code reward graded from a
process that has JAX running."""
import subprocess
import sys
import textwrap

import pytest

from testutil import REPO, run_vt

# Any absl warning (Orbax logs through absl) counts: in a normal run none is something the user must act on.
NOISE = ("WARNING:absl:", "Metadata file does not exist", "_CHECKPOINT_METADATA", "os.fork() was called")


def assert_quiet(text: str) -> None:
    noisy = [line for line in text.splitlines() if any(n in line for n in NOISE)]
    assert not noisy, "\n".join(noisy[:5])


def test_sft_then_rl_from_a_step_checkpoint_prints_no_noise(tmp_path):
    sft = run_vt("train", "--config", "configs/sft_stage1.py:smoke", "--workdir", str(tmp_path / "sft"),
                 "--config.train.steps=2", "--config.checkpoint.every=1", "--config.train.progress=False")
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert_quiet(sft.stdout + sft.stderr)
    step = tmp_path / "sft" / "checkpoints" / "2"
    assert not (step / "params" / "_CHECKPOINT_METADATA").exists()  # the item the warning was about
    rl = run_vt("train", "--config", "configs/mgpo_math.py:smoke", "--workdir", str(tmp_path / "rl"),
                f"--config.model.init_checkpoint={step}", "--config.train.steps=1")
    assert rl.returncode == 0, rl.stderr[-3000:]
    assert_quiet(rl.stdout + rl.stderr)
    assert "finished at step 1" in rl.stdout


# The sandbox joins each run's memory cgroup and drops to its uid with no Python between fork and exec (a shell and
# setpriv do it after the exec), so no fork handler runs in a child of this JAX process.
def test_code_reward_from_a_jax_process_forks_nothing():
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        jnp.ones(4).block_until_ready()  # JAX's threads are up: a fork now is what it warns about
        from vt.rewards.code.reward import CodeReward
        with CodeReward(workers=2, allow_unsandboxed=True) as r:
            res = r([{"tests": [{"input": "1 2", "output": "3"}]}],
                    ["```python\\na, b = map(int, input().split())\\nprint(a + b)\\n```"])
        print("score", res[0].score)
    """)
    proc = subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "score 1.0" in proc.stdout
    assert_quiet(proc.stdout + proc.stderr)


# Modules that may fork: the code harness and the warm pool's server run inside the sandbox, in processes that never
# import JAX.
MAY_FORK = {f"vt/rewards/sandbox/inside/{f}.py" for f in ("harness", "pool_server", "inits", "tester")}


def test_no_module_forks_without_exec():
    """Read from the source: nothing in vt calls os.fork, passes a preexec_fn (Python code between fork and exec)
    or uses multiprocessing (whose default start method on Linux is a bare fork) outside MAY_FORK. Subprocesses
    start through subprocess without a preexec_fn: fork/vfork and exec in C, no Python in between."""
    import ast
    found = []
    for path in sorted((REPO / "vt").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel in MAY_FORK:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.keyword) and node.arg == "preexec_fn":
                found.append(f"{rel}:{node.value.lineno}: preexec_fn")
            elif isinstance(node, ast.Attribute) and node.attr in ("fork", "forkpty") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"{rel}:{node.lineno}: os.{node.attr}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n.split(".")[0] == "multiprocessing" for n in names):
                    found.append(f"{rel}:{node.lineno}: multiprocessing")
    assert not found, found
