"""Eager PyTorch implementations of the operators, in working precision.

They run on whatever device their inputs live on (CPU or CUDA), validate their
arguments like the TileLang kernels do, and serve both as the implementation
that CI exercises without a GPU and as a baseline for the benchmarks.
"""
