"""The pipeline from a model to a model, one step a module; ``optimize`` runs them in order.

- ``optimize``: load, shapes, fuse (fusion/driver), lower the fused model for each candidate target,
  choose each block's form, report;
- ``target_choice``: which target ``--target auto`` / ``--ep`` takes, with the load check;
- ``forms``: the measured cost tables and the per-block choice of form (never slower);
- ``length_dispatch``: an ``If`` on the run's key length around a block whose length is known only at
  run time: the fused form past its crossover, the original ops below;
- ``fused_rows``: what each fused node proves for its report row;
- ``tune``: ``--tune``, the forms timed on this machine;
- ``opset``: the default-domain opset raised op by op (for ``--target onnx``);
- ``ir_versions``: the IR version a written model carries, the highest ONNX Runtime loads;
- ``native_attention``: the note on com.microsoft attention nodes a model already has;
- ``rounding``: marks fused blocks whose output soon reaches a quantizer, where float32 rounding
  can flip an integer (the report's rounding column);
- ``first_run``: the load check: a model about to be written opens in ONNX Runtime, and one with
  lowered nodes runs once (on the random inputs the original runs on).
"""
