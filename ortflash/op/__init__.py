"""The one op every stage meets at: its contract (spec), the softmax policy a node runs under
(policy), one application of it (call: the block IR both front ends build and the lowerings
read) and its node, written and read back (node, with the metadata keys that link a node to
its report row)."""
