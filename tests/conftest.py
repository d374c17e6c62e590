"""Fixtures the GPU test files share: the TileLang kernel modules, and the lowering-only guard."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

HAS_TILELANG = importlib.util.find_spec("tilelang") is not None


def _kernels_on_cuda(family: str):
    if not torch.cuda.is_available():
        pytest.skip("the TileLang kernels need a CUDA device, which this machine lacks")
    if not HAS_TILELANG:
        pytest.skip("the TileLang kernels need the module 'tilelang', which is not installed")
    return importlib.import_module(f"kernels.{family}")


@pytest.fixture(scope="session")
def tilelang_family():
    """family -> kernels.<family>, for a GPU test: skips, with the reason, without CUDA or tilelang."""
    return _kernels_on_cuda


@pytest.fixture(scope="module")
def tilelang_only():
    """Tests that lower kernels to CUDA source: they need tilelang but no GPU."""
    if not HAS_TILELANG:
        pytest.skip("lowering needs the module 'tilelang', which is not installed")
