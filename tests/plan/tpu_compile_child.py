"""Child process of tests/plan/test_tpu_compile.py: compile the tiny model's programs for a TPU topology with
libtpu's compile-only devices and print one JSON line per program. Run with JAX_PLATFORMS=cpu and
ALLOW_MULTIPLE_LIBTPU_LOAD=1 (the test sets both), so it never holds a TPU and shares libtpu with other workers.

    python tests/plan/tpu_compile_child.py v5p-8 sft,rl_update,decode
"""
import dataclasses
import json
import sys

import jax

from vt.model.attention import resolve
from vt.model.config import preset
from vt.plan import programs as pg
from vt.plan import topology
from vt.sampling.config import SamplerConfig
from vt.sharding import MeshConfig, make_mesh, platform, use_mesh


def main(topo_name: str, what: list[str]) -> None:
    topo = topology.parse(topo_name)
    devices = topology.devices(topo)
    n = len(devices)
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), devices)
    with use_mesh(mesh):
        print(json.dumps({"program": "platform", "platform": platform(), "default_backend": jax.default_backend(),
                          "auto": resolve("auto", "bfloat16"), "processes": len({d.process_index for d in devices})}),
              flush=True)
    # The tiny preset with heads of 128 lanes, so that the decode takes the Pallas kernel (vt.model.kv_pages.
    # tpu_kernel_fits); splash attention for the no-cache passes; bf16 compute as on a pod.
    cfg = dataclasses.replace(preset("tiny"), head_dim=128, dtype="bfloat16", attention_impl="auto")
    builders = {
        "sft": lambda: pg.sft_step(pg.train_setup(cfg, mesh), mesh, 2, n, 256),
        "rl_update": lambda: pg.rl_update(pg.train_setup(cfg, mesh), mesh, n, 256),
        "decode": lambda: pg.decode(pg.sampler_setup(dataclasses.replace(cfg, param_dtype="bfloat16"), mesh,
                                                     SamplerConfig(batch_size=2 * n, steps_per_call=2)),
                                    mesh, pool_pages=64, table_pages=8),
    }
    for name in what:
        compiled = builders[name]()()
        mem = compiled.memory_analysis()
        print(json.dumps({"program": name, "kernels": compiled.as_text().count("tpu_custom_call"),
                          "temp_bytes": int(mem.temp_size_in_bytes),
                          "argument_bytes": int(mem.argument_size_in_bytes)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
