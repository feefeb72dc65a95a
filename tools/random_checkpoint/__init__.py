"""Random-weight checkpoints of SGLang 0.5.23's Cosmos3 and π0.5, built from SGLang's own
model classes (tools/random_checkpoint/README.md).

``specs`` (configuration files, pure Python) imports anywhere; the rest needs the SGLang
environment (torch, transformers, sglang). Run: ``python tools/random_checkpoint --help``.
"""
