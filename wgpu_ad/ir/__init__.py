"""The IR: the op table, the node shape, builder, printer, verifier and the NumPy reference interpreter."""
