"""Acceptance and speed benchmarks (``eagle3 bench``) and regression checks (``eagle3 check``)."""
