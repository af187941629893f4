"""Graph machinery shared by fusion and lowering: questions asked of an onnx-ir graph
(ir_utils), the one dim and shape evaluator (shapes) and the one node writer (emitter)."""
