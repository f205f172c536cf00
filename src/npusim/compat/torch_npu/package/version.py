"""``torch_npu.version``: the torch_npu release npusim's torch_npu stands for.

torch_npu's version follows the torch it is built for (Ascend/pytorch ``version.txt``
lists 2.13.0 for torch 2.13); npusim pins torch 2.13.0.
"""

__version__ = "2.13.0"
