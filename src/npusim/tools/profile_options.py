"""The ``--profile`` and ``--profile-overrides`` options of the subcommands that take a chip profile
(``run``, ``timeline``, ``calibrate``): one parser, one error text, one way to make the choice current.

``--profile-overrides`` takes what ``NPUSIM_PROFILE_OVERRIDES`` takes (``KEY=V,...``: the flags, the
link and host figures, the chip's peaks, the efficiencies of Note [Calibrated efficiencies] and
``roofline=1``) or the path of a ``.json`` / ``.yaml`` file holding one mapping of the same keys. The
profile module is imported only when an option is read, so a subcommand's ``--help`` starts no device.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

_EXPECTED = "KEY=V,... (NPUSIM_PROFILE_OVERRIDES' keys, e.g. cube_eff_large=0.6,roofline=1) or a .json / .yaml file"


def _preset(text: str) -> str:
    from npusim.runtime.profiles import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {text!r}; expected one of {', '.join(sorted(PRESETS))}")
    return text


def _overrides(text: str) -> dict[str, Any]:
    from npusim.runtime.profiles import read_overrides

    try:
        return read_overrides(text, "--profile-overrides")
    except ValueError as error:  # argparse shows an ArgumentTypeError's text, naming the option
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser, default: str | None) -> None:
    """Adds ``--profile`` (``default``; None: NPUSIM_PROFILE's) and ``--profile-overrides``."""
    where = f"default {default}" if default else "default: NPUSIM_PROFILE's, else training_soc"
    parser.add_argument("--profile", default=default, type=_preset, help=f"the chip profile preset ({where})")
    parser.add_argument("--profile-overrides", default={}, type=_overrides, metavar="KEY=V,...|FILE",
                        help=f"profile settings over the preset: {_EXPECTED}")


def make(args: argparse.Namespace) -> Any:
    """The Profile the options name (a preset given, or the default profile, with the overrides)."""
    from npusim.runtime.profiles import DEFAULT, make_profile

    return make_profile(args.profile or DEFAULT, **args.profile_overrides)


def select_for_job(args: argparse.Namespace, environ: os._Environ[str] | dict[str, str] = os.environ) -> None:
    """For ``run``: makes the options' profile current, over NPUSIM_PROFILE and NPUSIM_PROFILE_OVERRIDES
    (the options' keys win), and writes it back to ``environ`` so the job's child processes (torchrun's
    ranks, spawned workers) select the same. Without either option nothing changes."""
    if args.profile is None and not args.profile_overrides:
        return
    from npusim import config
    from npusim.runtime.profiles import parse_overrides, set_profile

    name = args.profile or config.profile_name()
    merged = {**parse_overrides(config.env("NPUSIM_PROFILE_OVERRIDES")), **args.profile_overrides}
    set_profile(name, **merged)
    environ["NPUSIM_PROFILE"] = name
    environ["NPUSIM_PROFILE_OVERRIDES"] = ",".join(f"{key}={value}" for key, value in merged.items())
