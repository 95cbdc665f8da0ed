"""Learners: losses (pure functions), the optimiser, the jitted train step, the SFT loop, checkpoint merging.

Module map: optim (AdamW + schedule), losses (token cross-entropy), state (TrainState and its shardings),
step (the jitted pure train/eval steps), metrics (TensorBoard/JSONL/progress), sft (the SFT learner loop),
synthetic (a learnable token task for smoke runs and tests), merge (parameter averaging of checkpoints),
selection (pass@k scoring and per-domain choice for Diversity-Exploring Distillation), commands (`vt train`,
`vt merge`).
"""
