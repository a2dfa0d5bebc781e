"""Every `entropyrl <verb>`: the local runner's demo and studies, the converters (prepare), the
launch scripts' steps (launch, preflight, smoke), the doctor, the evaluations and the LoRA merge.

They may import every package below them (the plugin `entropyrl.verl`, the local runner
`entropyrl.rig.local`, data, evaluation, rewards, models and the core); only `entropyrl.cli`
imports them.
"""
