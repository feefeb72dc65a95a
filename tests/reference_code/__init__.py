"""The training pipelines' own prompt code, copied verbatim (see each function) because those
packages cannot be installed beside ours: openpi is not on PyPI and imports JAX; LeRobot 0.6.1
needs Python 3.12. Only the tokenizer loading is replaced by a ``tokenizer`` argument. Tests
compare the project's requests with what this code produces; the project never imports it."""
