"""The entry point torch's device-backend autoload calls (group ``torch.backends``, pyproject.toml).

``import torch`` loads every entry point of that group and calls it (PyTorch RFC
#122468), as it does for torch_npu. Loading this one imports the npusim package, which
registers the npu device, ``torch.npu``, the hccl backend and ``torch.compile`` support,
so ``import torch`` alone makes ``device="npu"`` work. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns it off (torch reads the variable); ``setup.py`` sets it, so building npusim never
imports the npusim being built. It does not provide ``torch_npu``: only ``python -m
npusim run`` does (Note [The torch_npu of npusim run]).
"""

__all__ = ["autoload"]


def autoload() -> None:
    """Nothing left to do: importing npusim registered everything."""
