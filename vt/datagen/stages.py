"""The driver every `vt data` subcommand shares: resumable, batched, with a progress bar and a report."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from vt import VtError
from vt.io import ResumableWriter, count_rows, read_rows

# The reason a step gives for a row it could not process for a passing cause (the teacher endpoint is down): the
# row is not journaled, so a re-run retries it, and the run stops at once (the finished rows are kept).
RETRY = "retry"

# process(i, where, row) -> (output rows, reason, detail); reason "kept" when rows are written
Step = Callable[[int, str, dict], tuple[list[dict], str, object]]
# batch(items: [(i, where, row)]) -> [(outputs, reason, detail)] per item (teacher calls batch across rows)
BatchStep = Callable[[list[tuple[int, str, dict]]], list[tuple[list[dict], str, object]]]


def open_writer(out: str | Path) -> ResumableWriter:
    return ResumableWriter(out)


def run_stage(inp: str | Path, writer: ResumableWriter, step: Step | None = None, *,
              batch_step: BatchStep | None = None, batch_size: int = 1, desc: str = "", progress: bool = True, report: dict | None = None) -> dict:
    """Feed every not-yet-done input row through ``step`` (or ``batch_step``) and record the outcome."""
    total = count_rows(inp)
    bar = tqdm(total=total, initial=len(writer.done), desc=desc, unit="row", disable=not progress)
    pending: list[tuple[int, str, dict]] = []

    def flush():
        results = batch_step(pending) if batch_step is not None else [step(*x) for x in pending]
        retry = []
        for (i, where, _), (outs, reason, detail) in zip(pending, results):
            if reason == RETRY:
                retry.append((where, detail))
            else:
                writer.write(i, outs, reason, detail, where)
        bar.update(len(pending) - len(retry))
        pending.clear()
        if retry:
            where, detail = retry[0]
            raise VtError(f"{where}: {detail}; stopped with {len(retry)} row(s) of this batch not done (they are "
                          f"not marked rejected): re-run the same command to retry them, finished rows are kept")

    try:
        for i, (where, row) in enumerate(read_rows(inp)):
            if i in writer.done:
                continue
            pending.append((i, where, row))
            if len(pending) >= batch_size:
                flush()
        if pending:
            flush()
    except BaseException:
        writer.close()
        raise
    finally:
        bar.close()
    return writer.finish({"input": str(inp), "rows": total, **(report or {})})
