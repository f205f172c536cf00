"""``torchair.configs``: the compiler configuration (See Note [torchair in npusim])."""

from .compiler_config import CompilerConfig

__all__ = ["CompilerConfig"]
