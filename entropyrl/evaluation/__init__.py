"""Hallucination evaluation building blocks: POPE (questions, answer parsing, metrics) and the
bootstrap over images that puts an interval on every metric and on every difference of two
models. This package may import `entropyrl.core.files`, `entropyrl.data`, `entropyrl.rewards`,
`chair_server` and third-party libraries, nothing else of entropyrl.
"""
