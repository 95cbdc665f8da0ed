"""Which slots of a row may attend to which: the segment-id convention of every attention path without a cache.

    segment_ids_BT int32: 0 = padding, 1..k = the documents packed in the row (vt.data.packing),
                   s + j * BRANCH (j = 1, 2, ...) = branch j of document s: a continuation that sees document s
                   (its shared prefix) and itself, never the other branches of s.

A query at slot t sees a key at slot u <= t (causal in row order) when `visible(seg_t, seg_u)`: the same segment,
or the key is in the query's prefix document. Branches let the G samples of an RL group hold their prompt once
(vt.rl.rollouts.build_rows, share=True): prompt slots are document s, each completion a branch of it, with
positions continuing the prompt's, so every completion sees exactly [prompt, itself] as when it had a row of its
own, and the prompt's forward pass and gradient are computed once instead of G times (the idea of "Prefix
Grouper", Liu et al. 2025). Branches are masked where the model is built with ModelConfig.segment_branches (the
RL learner's model when it shares prompts): the second compare per score costs 3-7% of the tiny SFT step, so
every other path compares ids for equality (and rows without branches, every id < BRANCH, mask the same either way).
"""
from __future__ import annotations

BRANCH = 1 << 20  # ids of documents in a row stay below it (a row holds far fewer than 2^20 documents)


def prefix(seg):
    """The prefix document of each segment id: itself for a document (and padding), s for a branch of s."""
    return seg & (BRANCH - 1)


def visible(seg_q, seg_k, prefix_q=None, *, branches: bool = True):
    """Query segment ids vs key segment ids (broadcasting arrays): may the query attend to the key (causality
    aside)? Same segment, or with `branches` the key's segment is the query's prefix document (`prefix_q`:
    prefix(seg_q), passed when a loop has it already). Without `branches`, plain equality: one compare per score
    instead of two, for the paths that never see branches (the model's static ModelConfig.segment_branches)."""
    if not branches:
        return seg_q == seg_k
    return (seg_q == seg_k) | ((prefix(seg_q) if prefix_q is None else prefix_q) == seg_k)
