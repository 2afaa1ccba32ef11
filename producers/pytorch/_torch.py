"""The one place that imports torch, with an error that says how to install it."""

from __future__ import annotations

from types import ModuleType

INSTALL_HINT = ("producers.pytorch needs PyTorch, which is not installed: `pip install torch==2.13.0` "
                "(the CPU wheel; an unpinned `pip install torch` downloads a multi-GB CUDA build)")


def require_torch() -> ModuleType:
    """`torch`, with `torch.distributed` loaded; ImportError naming `pip install torch` if absent."""
    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    if not torch.distributed.is_available():
        raise ImportError("this PyTorch build has no torch.distributed; install one that has it "
                          "(`pip install torch==2.13.0`)")
    return torch
