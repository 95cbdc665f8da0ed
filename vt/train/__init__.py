"""Learners: losses (pure functions), the optimiser, the jitted train step, the shared loop, the SFT learner,
checkpoint merging.

Module map: optim (AdamW + schedule), losses (chunked token log-probs, masked NLL), state (TrainState and its
shardings), step (the jitted pure train/eval steps and the update tail the RL step shares), loop (what SFT and RL
share: set-up, resume, preemption, cadence, the non-finite halt), metrics (TensorBoard/JSONL/progress), sft (the
SFT learner), synthetic (a learnable token task for smoke runs and tests), merge (parameter averaging of
checkpoints), selection (pass@k scoring and per-domain choice for Diversity-Exploring Distillation), commands
(`vt train`, `vt merge`).
"""
