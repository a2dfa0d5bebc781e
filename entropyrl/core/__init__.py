"""The algorithm core: plain PyTorch functions on tensors, which the engines (verl in
`entropyrl.verl`, the one-machine runner in `entropyrl.rig.local`) call and never restate.

- `specs`: every algorithm knob, its default written once, parsed strictly;
- `entropy`, `_segments`: per-token entropy and the `<think>` segment masks;
- `advantages`, `maxent`: the group-relative estimators and their entropy guidance;
- `clip_schedules`: per-sample clip_high bounds from CHAIR_i; `losses`: the PPO surrogate;
- `algorithms`: the estimator table both engines dispatch through, each entry declaring what it
  reads; `estimator_names` reads those declarations without importing torch;
- `files`: atomic writes and stable hashes (the lowest layer, used by every package).
"""
