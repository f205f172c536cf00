"""``python -m npusim``: the command line (``npusim.tools.cli``: demo, benchmarks, audit, ...)."""

from npusim.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
