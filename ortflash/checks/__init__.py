"""Proving rewrites numerically: inputs, the one comparison, and the three checks.

- ``feeds``: the inputs every check runs on (random, with padding masks; or a ``.npz`` file);
- ``compare``: the one comparison of two outputs and the one tolerance default;
- ``run``: the one way a check opens an ONNX Runtime session;
- ``first_run``: a model optimize is about to write opens in ONNX Runtime, and one with lowered nodes runs;
- ``verify``: a whole optimized model against its original, each fused node in every softmax it runs deployed;
- ``validate``: each fused node's kernel against the subgraph it replaced;
- ``web_check``: a lowered model in ONNX Runtime's JavaScript runtimes (its Node runner ships in ``web/``);
- ``rounding``: fused blocks whose output soon reaches a quantizer, where float32 rounding can flip integers.
"""
