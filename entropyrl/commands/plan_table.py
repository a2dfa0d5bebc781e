"""Print docs/scaling.md's planning table: the captioning recipe composed for one node of 8
GPUs, planned per model x GPU x {full, LoRA} (`entropyrl.verl.checks.plan.planning_table`).

    python -m entropyrl.commands.plan_table > table.md   # then paste between its markers
"""

from __future__ import annotations


def main() -> int:
    from entropyrl.commands.preflight import compose_recipe
    from entropyrl.verl.checks.plan import planning_table

    print(planning_table(compose_recipe("chair_mscoco", ["trainer.n_gpus_per_node=8"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
