"""Reproducible bug scenarios: small, real multi-rank programs that show a known failure."""
