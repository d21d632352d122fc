"""ti.ad: reverse-mode autodiff API."""
