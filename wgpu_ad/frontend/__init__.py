"""Python AST -> IR: one visit_ per supported construct, desugaring tables."""
