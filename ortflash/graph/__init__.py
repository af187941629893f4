"""Graph machinery shared by fusion and lowering: questions asked of an onnx-ir graph
(ir_utils), the one dim and shape evaluator (shapes; its deep mode: interpret, terms, dim_terms,
op_readers) and the one node writer (emitter)."""
