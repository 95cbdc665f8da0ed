"""OPD's teachers (issue 51): a vt checkpoint scored in process, and an OpenAI-compatible endpoint serving that
same teacher's prompt log-probs (a local server answering /v1/completions with echo and logprobs, and /tokenize,
as vLLM does, from the real in-process teacher) give the same per-token advantages; a teacher with another
vocabulary is refused at start, naming both."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from vt import VtError
from vt.checkpoint.params import save_model
from vt.data.tokenizer import build_tiny_tokenizer
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.rl.opd import OpdConfig, opd_advantages
from vt.rl.teachers import CheckpointTeacher, StreamingTeacher, make_teacher
from vt.sharding import make_mesh


def serve(teacher: CheckpointTeacher, tokenizer):
    """A vLLM-shaped server of `teacher`'s prompt log-probs (each prompt token's given the ones before it, the
    first None) and of `tokenizer`'s ids."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":
                out = {"tokens": tokenizer.encode(body["prompt"]), "count": 0}
            elif self.path == "/v1/completions" and body["echo"] and body["logprobs"] == 0:
                ids = body["prompt"]
                lps = teacher.logprobs([p[:1] for p in ids], [p[1:] for p in ids])
                out = {"choices": [{"index": i, "text": "", "logprobs": {
                    "token_logprobs": [None] + [float(x) for x in lp] + [-0.5]}}  # + the one generated token's
                    for i, lp in reversed(list(enumerate(lps)))]}  # any order: the client sorts by index
            else:
                self.send_error(404)
                return
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("opd_teacher")
    tok = build_tiny_tokenizer(root / "tok", vocab_size=400)
    cfg = preset("tiny")
    save_model(root / "teacher", create_model(cfg, None, seed=5))
    mesh = make_mesh()
    # float32: the endpoint scores each whole sequence as one completion, rows laid out unlike the in-process
    # teacher's, and the check is to 1e-5 (bf16, the default, rounds to ~1e-2)
    teacher = CheckpointTeacher(str(root / "teacher"), mesh, dtype="float32")
    server = serve(teacher, tok)
    yield {"root": root, "tok": tok, "cfg": cfg, "mesh": mesh, "teacher": teacher,
           "url": f"http://127.0.0.1:{server.server_address[1]}"}
    server.shutdown()


def pairs(seed: int, n: int = 7):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, 400, rng.integers(2, 9)).tolist() for _ in range(n)]
    completions = [rng.integers(1, 400, rng.integers(1, 30)).tolist() for _ in range(n)]
    return prompts, completions


def streamed(teacher, prompts, completions, batch=3):
    with StreamingTeacher(teacher, batch, len(prompts)) as st:
        for i in reversed(range(len(prompts))):  # in any order, as samples finish
            st.submit(i, prompts[i], completions[i])
        return st.results()


def test_opd_endpoint_teacher_gives_the_in_process_teachers_advantages(setup):
    prompts, completions = pairs(0)
    cfg = OpdConfig(teacher=setup["url"], kl_coef=0.8)
    endpoint = make_teacher(cfg, setup["cfg"], setup["mesh"], setup["tok"], str(setup["root"] / "tok"))
    local, remote = (streamed(t, prompts, completions) for t in (setup["teacher"], endpoint))
    rng = np.random.default_rng(1)
    for c, a, b in zip(completions, local, remote):
        assert a.shape == b.shape == (len(c),)
        assert np.all(a < 0) and np.all(a > -20)  # real log-probs of a random 512-way model
        sampler = -rng.random(len(c)) * 6
        mask = np.ones(len(c))
        np.testing.assert_allclose(opd_advantages(b, sampler, mask, cfg.kl_coef),
                                   opd_advantages(a, sampler, mask, cfg.kl_coef), atol=1e-5, rtol=0)
    # a pair alone in its own batch: the same log-probs as among others (the packing does not leak)
    alone = setup["teacher"].logprobs(prompts[2:3], completions[2:3])[0]
    np.testing.assert_allclose(alone, local[2], atol=1e-5, rtol=0)


def test_opd_teacher_with_another_vocabulary_is_refused_at_start(setup, tmp_path):
    other = setup["cfg"].replace(vocab_size=1024)
    save_model(tmp_path / "big", create_model(other, None, seed=0))
    with pytest.raises(VtError, match=r"opd.teacher=.*big: vocab_size 1024, but the student's is 512"):
        make_teacher(OpdConfig(teacher=str(tmp_path / "big")), setup["cfg"], setup["mesh"], setup["tok"], "tok")
    # an endpoint whose tokenizer is not the student's
    tok2 = build_tiny_tokenizer(tmp_path / "tok2", texts=["only a few words here"] * 5, vocab_size=300)
    server = serve(setup["teacher"], tok2)
    try:
        with pytest.raises(VtError, match=r"its tokenizer .* differs from data.tokenizer=.*tok \(vocab"):
            make_teacher(OpdConfig(teacher=f"http://127.0.0.1:{server.server_address[1]}/v1"), setup["cfg"],
                         setup["mesh"], setup["tok"], str(setup["root"] / "tok"))
    finally:
        server.shutdown()
