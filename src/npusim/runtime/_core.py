"""The loaded C++ device core. Importing this module builds it on first use."""

from npusim._build import load_core

C = load_core()
