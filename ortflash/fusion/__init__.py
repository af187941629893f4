"""Fusion: the front ends (the Softmax one, softmax.py: read by softmax_read over the rules into
a frozen softmax_block.SoftmaxBlock, written by softmax_write; the ONNX Attention op,
onnx_attention.py) read each block without changing the graph and build its
op.call.FlashAttentionCall, which op.node.write_call writes as one node; driver.fuse is the one
loop around them."""
