"""Steps optimize applies to every model it makes, besides fusing and lowering.

- ``rounding``: marks fused blocks whose output soon reaches a quantizer, where float32 rounding
  can flip an integer (the report's rounding column);
- ``first_run``: the load check: a model about to be written opens in ONNX Runtime, and one with
  lowered nodes runs once (on the random inputs the original runs on).
"""
