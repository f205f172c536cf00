"""Test support shipped with npusim: the bounded multi-rank launcher
(:mod:`~npusim.testing.ranks`), the FSDP2 harness (:mod:`~npusim.testing.fsdp_harness`)
and the models the tests, benchmarks and demo share (:mod:`~npusim.testing.models`).
Product code never imports this package; tests, benchmarks and tools do."""
