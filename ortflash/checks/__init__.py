"""Proving rewrites numerically: inputs, the one comparison, and the three checks.

- ``feeds``: the inputs every check runs on (random, with padding masks; or a ``.npz`` file);
- ``compare``: the one comparison of two outputs and the one tolerance default;
- ``sessions``: the one way a check opens an ONNX Runtime session and runs a model;
- ``verify``: a whole optimized model against its original, each fused node in every softmax it runs deployed;
- ``validate``: each fused node's kernel against the subgraph it replaced;
- ``web_check``: a lowered model in ONNX Runtime's JavaScript runtimes (its Node runner ships in ``web/``);
  ``web_files``: the files they share with it; ``browser``: headless Chromium; ``webgpu_plugin``: the WebGPU plugin EP.

The load check and the rounding marks optimize applies to every model are in ``ortflash.pipeline``.
"""
