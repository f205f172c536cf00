"""``torch_npu.utils.collect_env``: ``get_cann_version`` (the profile's CANN release)."""

from npusim.runtime import utils as _utils

__all__ = ["get_cann_version"]


def get_cann_version(module: str = "CANN") -> str:
    """torch_npu's ``collect_env.get_cann_version``: the simulated CANN package's version
    (``torch.npu.utils.get_cann_version``)."""
    return _utils.get_cann_version(module)
