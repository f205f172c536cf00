"""Differential conformance of the npu against PyTorch's CPU, over PyTorch's OpInfo database.

- :mod:`.compare`: one op, one dtype, in this process (Note [Differential conformance]);
- :mod:`.worker` and :mod:`.sweep`: the crash-safe pool of subprocesses that runs many;
- :mod:`.expected_failures`: the one list of ops expected to fail, each with its reason;
- :mod:`.judge`: applies that list (xfail / xpass) and sums a sweep up;
- :mod:`.misuse`: calls PyTorch's kernels refuse (error inputs, out= tensors of
  another dtype, written tensors that overlap), each a stream task, against CPU.

The CLIs are ``python -m npusim conformance ops`` and ``... conformance misuse``;
``tests/test_conformance_ops.py`` runs a sample-limited sweep of every op, and
``tests/test_host_checks.py`` every op's first float32 sample of the misuse kinds.
"""
