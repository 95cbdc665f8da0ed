"""What a verifier reads of a sample: its final answer. A sample with tool turns holds the policy's calls, the
tools' outputs and its last turn; only the text after the last tool turn is the answer (what a tool printed, or
an answer written before the last call, is not graded). RL's rewards (vt.rl.rollouts) and `vt eval`
(vt.eval.generation) read it alike."""
from __future__ import annotations

import numpy as np


def final_answer(sample, tokenizer) -> str:
    """`sample` (vt.sampling.engine.Sample): the engine's text (cut before a stop string), else the decoded tokens;
    with tool turns (policy_mask False somewhere), the part after the last one."""
    text = sample.text if sample.text is not None else tokenizer.decode(sample.completion_ids, skip_special_tokens=True)
    mask = sample.policy_mask
    if mask is None or np.all(mask):
        return text
    start = len(mask) - int(np.argmin(mask[::-1]))  # after the last tool token
    head = tokenizer.decode(sample.completion_ids[:start], skip_special_tokens=True)
    # The engine's text is the decoded tokens cut before a stop string: its tail past the head, that cut kept.
    return text[len(head):] if text.startswith(head) else tokenizer.decode(sample.completion_ids[start:],
                                                                            skip_special_tokens=True)
