"""Commands above both engines: the smoke (plan, build, run, check), the doctor, the launch
scripts' preflight and the function-calling evaluation.

They may import the plugin (`entropyrl.verl`), the local runner (`entropyrl.local`) and the
core; nothing below imports them.
"""
