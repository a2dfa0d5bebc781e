"""Every check a run passes before it trains, in one room.

- `findings`: one check's verdict (`Finding`) and the readers the checks share;
- `validation`: the algorithm sections, the clip schedule's switch, the trainer's scope, the
  registries and the data, refused inside `main_ppo` before any worker starts;
- `geometry`: how a step's batch splits over the ranks, as verl 0.9.1 asserts it later;
- `prompt_bound`: every prompt fits `data.max_prompt_length` without verl's length filter;
- `budget`: steps, time, GPU, host memory and disk of a run;
- `checkpoints`: the run's settings beside each checkpoint, and the resume decision;
- `stack`: verl, vLLM, torch, transformers, flash-attn and the NVIDIA driver;
- `layout`: the GPUs, the inputs and, on several nodes, a shared checkpoint folder.
- `nodes`: at start, one Ray task per node: its data files, an image, the model folder and
  the CHAIR service reachable there (imports Ray inside its function only).

`entropyrl preflight`, `entropyrl doctor --recipe` and the trainer's own check print from
these. Nothing here imports verl at module level: the commands check a config before verl is
imported.
"""
