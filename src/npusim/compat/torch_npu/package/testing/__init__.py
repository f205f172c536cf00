"""``torch_npu.testing``: the test helpers torch_npu's and op-plugin's own test files import.

Written for npusim with the contract those files rely on, so that they collect and run
unmodified under ``python -m npusim run -m pytest``:

- ``testcase``: ``TestCase`` (torch_npu's ``assertEqual`` with an absolute precision, the
  ``assertRtolEqual`` family) and ``run_tests``;
- ``common_utils``: ``SupportedDevices`` (reads the simulated SoC's name),
  ``SkipIfNotGteCANNVersion`` (the profile's CANN version), ``create_common_tensor``,
  ``freeze_rng_state``, the GradScaler cases ``_create_scaling_case`` and
  ``_create_scaling_models_optimizers``, ``get_cycles_per_ms``;
- ``common_distributed``: ``skipIfUnsupportMultiNPU``, ``with_comms``, ``init_pg``, ``TEST_SKIPS``;
- ``decorator``: ``Dtypes``, ``Formats``, ``instantiate_tests``;
- ``_internal.common_fsdp``: ``FSDPNPUTest``, PyTorch's FSDPTest on the npu over hccl.
"""
