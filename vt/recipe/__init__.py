"""The multi-stage recipe: the whole VibeThinker post-training recipe in one work directory.

    vt pipeline --config configs/vibethinker_3b.py --workdir runs/vibethinker      # or runner.run_pipeline
    vt pipeline --config configs/vibethinker_3b.py --workdir runs/x --validate     # check every input, run nothing
    vt demo                                                                        # configs/demo.py, tiny, CPU

Stages, in order (stages.STAGES; a config section per stage, `enabled` to skip one):

    data          demo only: the synthetic verifiable tasks and a byte-level BPE tokenizer trained on them
    sft1          SFT stage 1 on all data (vt.train.sft), periodic checkpoints
    profile       pass rates of sft1's final checkpoint on the SFT prompts (vt.rl.profile)
    sft2          SFT stage 2 from sft1 on the hard subset the profile selects
    select        Pass@K per domain of sft2's checkpoints, best per domain, parameter merge (vt.train.selection)
    rl_math       MGPO on math (vt.rl.learner); each RL stage first profiles its start and drops p in {0, 1}
    long2short    MGPO on math with Long2Short shaping (mgpo.long2short_lambda > 0)
    rl_code       MGPO on code, unit tests in the sandbox
    rl_stem       MGPO on STEM (answer and option matching)
    self_distill  sample the math/code/STEM RL checkpoints, keep verified traces, S_LP band selection
                  (vt.distill), SFT the student (the rl_stem checkpoint) on them
    rl_instruct   MGPO on instruction following (rule rewards)
    eval          vt.eval benchmarks on the final checkpoint
    export        Hugging Face export; optionally transformers' greedy text checked against vt's

Modules: stages (the table, each stage's plan and run, the wiring between stages), runner (validation, running,
manifests), report (table, plot, TensorBoard), commands (`vt pipeline`, `vt demo`). Only commands imports the
runner; the runner imports stages and report; report imports stages.
"""
