"""The verl adapter: estimators, policy loss, trainer and reward functions for verl 0.9.1.

`entropyrl.verl.plugin` is the `verl.plugins` entry point: verl imports it in every process
that imports verl, and it registers everything. This package's `__init__` stays empty so
`entropyrl doctor` (which lives here) can start without importing verl.
"""
