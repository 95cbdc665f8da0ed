"""The sampler's weights: on which devices it decodes (split_devices), and each update's params handed to it
(SamplerWeights). With LoRA the adapters are merged into a copy of the base weights first: the sampler runs the
plain model's decode step, no adapter matmuls per token (bench/lora_rollout.py on a loaded CPU, small preset,
rank 16: merged and applied level, 0.96x).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vt import VtError
from vt.model.lora import base_config, merged_params
from vt.rl.hosts import LocalReplicas
from vt.sharding import state_shardings
from vt.train.state import ModelDef


def split_devices(sampler_devices: int, teacher_devices: int = 0) -> tuple[list | None, list | None, list | None]:
    """(the learner's devices, the sampler's, an OPD teacher's): all, None (shared) and None for 0 / 0; else the
    teacher takes the last `teacher_devices`, the sampler the `sampler_devices` before them, the learner the rest."""
    if not sampler_devices and not teacher_devices:
        return None, None, None
    devices, own = jax.devices(), sampler_devices + teacher_devices
    field = "rollout.sampler_devices" if sampler_devices else "opd.teacher_devices"
    if jax.process_count() > 1:
        raise VtError(f"config {field}={sampler_devices or teacher_devices}: one process only (on "
                      f"{jax.process_count()} processes each samples and scores on its own devices already); set it "
                      "to 0")
    if own >= len(devices):
        raise VtError(f"config rollout.sampler_devices={sampler_devices} + opd.teacher_devices={teacher_devices}: "
                      f"must leave the learner at least one of the {len(devices)} devices")
    learner, rest = devices[:-own], devices[-own:]
    return learner, rest[:sampler_devices] or None, rest[sampler_devices:] or None


class SamplerWeights:
    """`weights(params)`: the learner's params as the sampler's nnx.State (of `md`; the base model with LoRA),
    dispatched, not waited for: the learner's own arrays (k = 0: the update that donates them runs after the
    sampling that reads them); a copy (`copy`, k >= 1: the sampler decodes the batch ahead while the update
    consumes the learner's); a device-to-device copy onto the sampler's sub-mesh (`own_devices`,
    rollout.sampler_devices); a full local copy per process on several (vt.rl.hosts.LocalReplicas, a collective)."""

    def __init__(self, model_cfg, md: ModelDef, sampler_mesh, *, own_devices: bool, copy: bool):
        self.model_cfg, self.mesh, self.own_devices = model_cfg, sampler_mesh, own_devices
        self.copy = copy and not own_devices  # the move onto the sampler's devices is a copy already
        self.md = ModelDef(base_config(model_cfg)) if model_cfg.lora_rank else md
        self.replicas = None if jax.process_count() == 1 else LocalReplicas(sampler_mesh)
        self._sh = None
        self._merge = jax.jit(lambda p: merged_params(p, model_cfg))

    def __call__(self, params) -> nnx.State:
        if self.copy:
            params = jax.tree.map(jnp.copy, params)
        if self.model_cfg.lora_rank:
            params = self._merge(params)
        state = nnx.state(self.md.bind(params))
        if self.replicas is None and not self.own_devices:
            return state
        if self._sh is None:
            self._sh = state_shardings(state, self.mesh)
        if self.replicas is None:
            return jax.device_put(state, self._sh)
        return self.replicas(state, self._sh)
