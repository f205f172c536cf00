"""The error of torchair's graph-engine calls under npusim."""


class GraphEngineNotSimulated(NotImplementedError):  # noqa: N818  (as NotSimulatedError's siblings read)
    """A call that builds an Ascend graph-engine (GE) graph; npusim has no graph engine
    (See Note [torchair in npusim])."""

    __module__ = "torch_npu.dynamo.torchair"  # public there (its __all__), not in the private _errors

    def __init__(self, call: str) -> None:
        super().__init__(
            f"{call}: Ascend graph-engine (GE) graphs are not built under npusim: torchair's backend here is "
            "npusim's inductor backend, which compiles the operators' own npu kernels and never runs a GE "
            "converter")
