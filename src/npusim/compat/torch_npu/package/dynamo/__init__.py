"""``torch_npu.dynamo``: torch_npu's graph-mode package, of which npusim simulates ``torchair``.

On Ascend, torch_npu ships torchair as ``torch_npu.dynamo.torchair`` and makes it importable as
the top-level ``torchair``; under ``python -m npusim run`` both names give
:mod:`torch_npu.dynamo.torchair` (npusim run's finder aliases ``torchair`` and its submodules
to it). See Note [torchair in npusim] there. torch_npu's dynamo backends registered by name
(``torch.compile(backend="npu")``, ``"npugraph_ex"``) are not registered: dynamo's own error
for an unknown backend names them; ``torchair.get_npu_backend()`` is the backend to pass.
"""
