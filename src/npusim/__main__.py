"""``python -m npusim``: demo, benchmarks, conformance probe and the FSDP2 patch audit."""

from npusim.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
