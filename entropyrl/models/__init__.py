"""Tiny models of the recipes' architectures, tokenizers and processors, built from config.

Used by both engines (the local runner and the verl smokes) and the tests; no downloads.
"""
