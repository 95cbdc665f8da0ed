"""RL on several processes (hosts): each one samples, verifies and scores its own share of the rollouts.

The learner is one SPMD program over the global mesh; rollouts are not. With P processes, every RL step's E
prompts are split into P consecutive slices of E/P prompts (whole groups: the C samples of a prompt stay on
one host, so group statistics and advantages need no communication). Each process

  1. samples its slice with its own sampler on its own devices (vt.distributed.process_mesh), holding a full copy of the
     weights (`LocalReplicas`: the learner's sharded params, gathered once per step by one collective and
     viewed as arrays over the local mesh, no trip through the host);
  2. runs the verifiers on its own samples (rewards are computed where the samples are);
  3. contributes its token rows to the global learner batch (vt.distributed.global_batch).

Sample j of prompt i draws from (seed, i, j) with i the prompt's index in the whole step
(Engine.generate(first_request=...)), so a split step samples what a single process would; metrics are
gathered from every process (vt.distributed.allgather) and written by process 0.

Letters: P processes, E prompts of a step, C completions per prompt (as vt.rl.objectives).
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from vt import VtError
from vt.sharding import MESH_AXES


def process_slice(n: int, what: str) -> slice:
    """This process's consecutive share of n items; n must divide evenly (names the setting `what`)."""
    p, count = jax.process_index(), jax.process_count()
    if n % count:
        raise VtError(f"config {what}={n} must be a multiple of the process count ({count}): each process "
                      "rolls out an equal share of whole prompt groups")
    k = n // count
    return slice(p * k, (p + 1) * k)


def _devices_of(process: int) -> list:
    return sorted((d for d in jax.devices() if d.process_index == process), key=lambda d: d.id)


class LocalReplicas:
    """Global (learner-sharded) arrays -> the same values as arrays over this process's own mesh
    (vt.distributed.process_mesh: its devices in id order).

    One jitted identity reshards the tree onto a mesh of every device shaped (replica, *local), replicated
    along `replica` (one replica per process) and laid out inside each process as the local sharding asks;
    the shards this process holds then form the local arrays as they are (no copy). All processes call it
    together: it is a collective (an all-gather of fsdp-sharded weights across hosts)."""

    def __init__(self, local: Mesh):
        self.local = local
        count = jax.process_count()
        grid = np.stack([np.array(_devices_of(p)[:local.devices.size]).reshape(local.devices.shape)
                         for p in range(count)])
        auto = (jax.sharding.AxisType.Auto,) * (1 + len(MESH_AXES))
        self.replica_mesh = Mesh(grid, ("replica", *MESH_AXES), axis_types=auto)
        self._fns: dict = {}

    def __call__(self, tree, local_shardings):
        leaves, treedef = jax.tree.flatten(tree)
        local_sh = jax.tree.leaves(local_shardings)
        if len(local_sh) != len(leaves):
            raise VtError("LocalReplicas: the shardings do not match the tree")
        replica_sh = tuple(NamedSharding(self.replica_mesh, s.spec) for s in local_sh)
        fn = self._fns.get(replica_sh)
        if fn is None:
            fn = self._fns[replica_sh] = jax.jit(lambda xs: xs, out_shardings=replica_sh)
        gathered = fn(tuple(leaves))
        out = [jax.make_array_from_single_device_arrays(x.shape, s, [sh.data for sh in x.addressable_shards])
               for x, s in zip(gathered, local_sh)]
        return jax.tree.unflatten(treedef, out)
