"""``torchair.ge_concrete_graph``: torchair's first GE API (converters, the GE graph), which
frameworks fall back to when ``torchair.ge`` is missing. Under npusim: the converter registry
(:mod:`.fx2ge_converter`) and the GE graph's names (:mod:`.ge_graph`, :mod:`.ge_apis`), whose
graph building raises GraphEngineNotSimulated (See Note [torchair in npusim])."""

from . import fx2ge_converter, ge_apis, ge_graph  # noqa: F401

__all__ = ["fx2ge_converter", "ge_apis", "ge_graph"]
