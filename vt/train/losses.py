"""Token-level losses: pure functions of final hidden states, the LM head, targets and masks.

Normalisation is per token over the global batch: for the micro-batches m of one optimiser step,
    loss = sum_m sum_{b,t} mask[m,b,t] * nll[m,b,t]  /  max(1, sum_m sum_{b,t} mask[m,b,t])
so every supervised token weighs the same whatever row, document or micro-batch it sits in (a packed row
with many short answers counts as much as their unpacked rows would).

Log-probs are computed in chunks of the sequence, never as float32 logits [B, T, V]: at coder-3b (V = 152K)
one 4096-token row's logits alone are 2.5 GB, and autodiff would keep them (and their softmax) for the backward
pass. `token_logps` scans over chunks of `chunk` positions with the chunk body under `jax.checkpoint`, so the
forward holds one chunk's logits [B, chunk, V] at a time and the backward recomputes them chunk by chunk.

Shape letters as in vt.model.qwen2 (B rows, T positions, D hidden, V vocabulary), plus J chunks of U positions.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from vt.sharding import constrain

# Sequence positions per chunk. The live float32 logits of one chunk are B x chunk x V x 4 bytes: 1.2 GB for 4
# rows at coder-3b's vocabulary, while B x chunk rows still keep the head matmul large enough to run at speed.
DEFAULT_LOSS_CHUNK = 512


def token_logps(x_BTD: jax.Array, head_DV: jax.Array, targets_BT: jax.Array, *, vocab_size: int, dtype,
                temperature: float = 1.0, chunk: int = DEFAULT_LOSS_CHUNK,
                with_entropy: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """log softmax(x @ head / temperature)[target] per position, float32 [B, T]; with `with_entropy`, also the
    entropy of that distribution per position (float32 [B, T], no gradient: a metric).

    The logits are those of `Qwen2.logits` (matmul in `dtype` with float32 accumulation), divided by
    `temperature` unless it is 0 or 1 (RL scores the distribution it sampled from; 0 means greedy sampling).
    Padded vocabulary rows of the head (index >= vocab_size) never score: they are masked to -inf rather than
    cut off, so the vocabulary axis keeps its even split over the tensor axis.
    """
    if chunk < 1:
        raise ValueError(f"token_logps: chunk must be >= 1, got {chunk}")
    B, T, D = x_BTD.shape
    Vp = head_DV.shape[1]
    dt = jnp.dtype(dtype)
    U = min(chunk, T)
    n = -(-T // U)
    if n * U != T:  # pad to whole chunks; the padded positions' log-probs are cut off below
        x_BTD = jnp.pad(x_BTD, ((0, 0), (0, n * U - T), (0, 0)))
        targets_BT = jnp.pad(targets_BT, ((0, 0), (0, n * U - T)))
    x_JBUD = x_BTD.reshape(B, n, U, D).swapaxes(0, 1)
    t_JBU = targets_BT.astype(jnp.int32).reshape(B, n, U).swapaxes(0, 1)
    # Gathered over fsdp once, outside the loop (split over vocab only), not once per chunk.
    head = constrain(head_DV.astype(dt), (None, "vocab"))
    vocab_V = jnp.arange(Vp, dtype=jnp.int32)

    def one_chunk(x_BUD, t_BU):
        x_BUD = constrain(x_BUD, ("batch", "sequence", "act_embed"))
        logits = jnp.einsum("bud,dv->buv", x_BUD.astype(dt), head, preferred_element_type=jnp.float32)
        logits = constrain(logits, ("batch", "sequence", "act_vocab"))
        if temperature not in (0.0, 1.0):
            logits = logits / temperature
        logits = jnp.where(vocab_V < vocab_size, logits, -jnp.inf)
        lse_BU = jax.nn.logsumexp(logits, axis=-1)
        # A masked sum instead of a gather: elementwise over the vocabulary, so it stays split over tensor.
        target_BU = jnp.sum(jnp.where(vocab_V == t_BU[..., None], logits, 0.0), axis=-1)
        logp_BU = target_BU - lse_BU
        if not with_entropy:
            return logp_BU, None
        logp_all = jax.lax.stop_gradient(logits - lse_BU[..., None])
        ent_BU = -jnp.sum(jnp.where(vocab_V < vocab_size, jnp.exp(logp_all) * logp_all, 0.0), axis=-1)
        return logp_BU, ent_BU

    if n == 1:
        # A row that fits in one chunk is one chunk: no loop, no remat (keeping that chunk's logits costs what the
        # chunk size already allows, and recomputing the head matmul would only slow short rows down).
        logp_BT, ent_BT = one_chunk(x_BTD, targets_BT.astype(jnp.int32))
        return (logp_BT, ent_BT) if with_entropy else logp_BT
    # Remat per chunk: the backward pass keeps only each chunk's inputs and recomputes its logits.
    body = jax.checkpoint(one_chunk, prevent_cse=False)
    _, (logp_JBU, ent_JBU) = jax.lax.scan(lambda _, xs: (None, body(*xs)), None, (x_JBUD, t_JBU))
    unchunk = lambda a_JBU: a_JBU.swapaxes(0, 1).reshape(B, n * U)[:, :T]  # noqa: E731
    return (unchunk(logp_JBU), unchunk(ent_JBU)) if with_entropy else unchunk(logp_JBU)


def masked_nll_sum(logp_BT: jax.Array, mask_BT: jax.Array, axis=None) -> tuple[jax.Array, jax.Array]:
    """(sum of mask * -logp, sum of mask) over `axis` (all by default). Masked positions contribute exactly 0,
    even if their log-probs are garbage (jnp.where, not a multiply, so an inf/NaN at a padded position cannot
    leak into the sum)."""
    mask = mask_BT.astype(jnp.float32)
    return jnp.sum(jnp.where(mask > 0, -logp_BT * mask, 0.0), axis=axis), jnp.sum(mask, axis=axis)
