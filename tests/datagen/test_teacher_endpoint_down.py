"""Issue 16 item 4: `vt data expand` with the teacher endpoint down stops at once with one clear line, journals
nothing as rejected, and the re-run (endpoint back) processes every row."""
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vt.cli import main


class Teacher(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that rewrites the seed problem it is given."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seed = body["messages"][-1]["content"].split("Original problem:\n", 1)[1]
        data = json.dumps({"choices": [{"message": {"role": "assistant",
                                                    "content": f"Problem: {seed} (variant)"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_expand_with_the_teacher_down_fails_fast_and_retries_on_rerun(tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on (yet)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seeds, out = tmp_path / "seeds.jsonl", tmp_path / "out.jsonl"
    seeds.write_text("".join(json.dumps({"id": x, "prompt": f"problem {x}"}) + "\n" for x in "ABCDEFGH"))
    argv = ["data", "expand", str(seeds), str(out), "--teacher", f"openai:http://127.0.0.1:{port}/v1|m",
            "--strategies", "skeleton,objective", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "unreachable" in err and "re-run the same command" in err and len(err.splitlines()) == 1, err
    journal = tmp_path / "out.jsonl.journal"
    assert not journal.exists() or journal.read_text() == ""  # nothing journaled, so nothing rejected for good
    rejected = tmp_path / "out.jsonl.rejected.jsonl"
    assert not rejected.exists() or rejected.read_text() == ""

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Teacher)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        assert main(argv) == 0
    finally:
        httpd.shutdown()
        httpd.server_close()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(f"{x}/{s}" for x in "ABCDEFGH" for s in ("skeleton", "objective"))
