"""``torchair.configs.compiler_config.CompilerConfig`` under npusim.

``mode`` chooses the backend's inductor mode (See Note [torchair in npusim]) and is checked as
torchair checks it; the graph-engine option groups keep what is set, read back as torchair's
options are (``config.<group>.<name>.value``), and change nothing: npusim has no graph engine.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CompilerConfig"]

MODES = ("max-autotune", "reduce-overhead", "npugraph_ex")
# torchair's option groups, each a tree of graph-engine options.
GROUPS = ("debug", "aoe_config", "export", "dump_config", "fusion_config", "experimental_config",
          "inference_config", "ge_config", "aclgraph_config", "npugraphex_config")


class _Option:
    """One option's value, read as ``option.value`` (torchair's OptionValue)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


class _OptionGroup:
    """A group of graph-engine options: assigning ``group.name = v`` keeps ``v`` (read back as
    ``group.name.value``); reading an unset name gives its subgroup, so nested options
    (``config.debug.graph_dump.type = "pbtxt"``) can be set."""

    def __init__(self, path: str) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_entries", {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        entries = object.__getattribute__(self, "_entries")
        if name not in entries:
            entries[name] = _OptionGroup(f"{object.__getattribute__(self, '_path')}.{name}")
        return entries[name]

    def __setattr__(self, name: str, value: Any) -> None:
        entries = object.__getattribute__(self, "_entries")
        if isinstance(entries.get(name), _OptionGroup) and entries[name].settings():
            raise AttributeError(f"torchair CompilerConfig: {self._path}.{name} is a group of options, "
                                 f"not an option")
        entries[name] = _Option(value)

    def settings(self) -> dict[str, Any]:
        """Every option set under this group, by dotted path."""
        found: dict[str, Any] = {}
        for name, entry in object.__getattribute__(self, "_entries").items():
            if isinstance(entry, _Option):
                found[f"{self._path}.{name}"] = entry.value
            else:
                found.update(entry.settings())
        return found


class CompilerConfig:
    """torchair's compiler configuration: ``mode`` ("max-autotune", "reduce-overhead" or
    "npugraph_ex"), set as ``config.mode = "reduce-overhead"`` and read as ``config.mode.value``,
    and the graph-engine option groups (kept, without effect under npusim)."""

    def __init__(self) -> None:
        object.__setattr__(self, "mode", _Option("max-autotune"))
        for group in GROUPS:
            object.__setattr__(self, group, _OptionGroup(group))

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "mode":
            if value not in MODES:
                raise ValueError(f"torchair CompilerConfig: mode must be one of {', '.join(MODES)}, got {value!r}")
            self.mode.value = value
            return
        if name in GROUPS:
            raise AttributeError(f"torchair CompilerConfig: {name} is a group of options; set its options "
                                 f"(config.{name}.<option> = value)")
        raise AttributeError(f"torchair CompilerConfig has no option {name!r} (options: mode, {', '.join(GROUPS)})")

    def settings(self) -> dict[str, Any]:
        """``mode`` and every graph-engine option set, by dotted path."""
        found: dict[str, Any] = {"mode": self.mode.value}
        for group in GROUPS:
            found.update(getattr(self, group).settings())
        return found

    def __repr__(self) -> str:
        return f"CompilerConfig({self.settings()})"
