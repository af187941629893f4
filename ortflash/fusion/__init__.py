"""Fusion: the two front ends (the Softmax walker with its rules, and the ONNX Attention op)
build a FlashAttentionCall (call) for each block and write it as one node (emit)."""
