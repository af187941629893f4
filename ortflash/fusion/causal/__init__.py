"""Causal masks proved from their subgraph (proof) and their key padding part written back (write)."""
