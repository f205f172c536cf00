"""Compatibility layers that let code written for other NPU stacks run on npusim."""
