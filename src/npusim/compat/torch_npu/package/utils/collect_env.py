"""``torch_npu.utils.collect_env``: ``get_cann_version`` (the profile's CANN release)."""

from npusim.runtime.utils import get_cann_version

__all__ = ["get_cann_version"]
