"""Slow, obviously-correct pure-Python references for the kernels.

Tests check each kernel against its reference; ``benchmarks/`` measures each kernel's speed-up over it.
"""
