"""Fusion: the front ends (the Softmax walker with its rules, walker.py; the ONNX Attention op,
onnx_attention.py) read each block and build its op.call.FlashAttentionCall, which
op.node.write_call writes as one node; driver.fuse is the one loop around them."""
