"""``torch_npu.profiler.profile``, ``tensorboard_trace_handler`` and ``analyse``.

``profile`` is ``torch.profiler.profile`` (npusim's device tasks are its PrivateUse1 activities) with
torch_npu's arguments; a trace is written in torch_npu's layout by npusim.compat.ascend_profiler (Note
[What npusim's torch_npu.profiler writes]).
"""

import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch_npu.profiler.experimental_config import _ExperimentalConfig
from torch_npu.profiler.profiler_interface import as_activity as _as_activity  # private here: not re-exported
from torch_npu.profiler.profiler_interface import supported_activities as _supported_activities
from torch_npu.profiler.profiler_interface import to_torch as _to_torch
from torch_npu.profiler.scheduler import _to_torch_action
from torch_npu.version import __version__

from npusim.compat.ascend_profiler import output, records, trace_view
from npusim.runtime.utils import get_cann_version

__all__ = ["analyse", "profile", "tensorboard_trace_handler"]


class profile(torch.profiler.profile):  # noqa: N801  (torch_npu's name)
    """torch_npu's profiler: a ``torch.profiler.profile`` of ``activities`` (default: CPU and NPU) whose
    ``on_trace_ready`` (``tensorboard_trace_handler``) writes torch_npu's ``*_ascend_pt`` directory."""

    def __init__(self, *, activities: Iterable[Any] | None = None,
                 schedule: Callable[[int], Any] | None = None,
                 on_trace_ready: Callable[..., Any] | None = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: _ExperimentalConfig | None = None,
                 use_cuda: bool | None = None) -> None:
        self.npu_activities = {_as_activity(a) for a in activities} if activities else _supported_activities()
        if schedule is not None and not callable(schedule):
            warnings.warn("torch_npu.profiler: schedule is not Callable, set by default.", stacklevel=2)
            schedule = None
        if on_trace_ready is not None and not callable(on_trace_ready):
            warnings.warn("torch_npu.profiler: on_trace_ready is not Callable, set by default.", stacklevel=2)
            on_trace_ready = None
        if use_cuda is not None:
            warnings.warn("torch_npu.profiler: this is npu environment, use_cuda is invalid", stacklevel=2)
        if experimental_config is not None and not isinstance(experimental_config, _ExperimentalConfig):
            raise TypeError("torch_npu.profiler.profile: experimental_config must be a "
                            f"torch_npu.profiler._ExperimentalConfig, got {type(experimental_config).__name__}")
        self.npu_experimental_config = experimental_config or _ExperimentalConfig()
        self.npu_common_config = {
            "activities": sorted(str(a) for a in self.npu_activities), "schedule": repr(schedule),
            "record_shapes": record_shapes, "profile_memory": profile_memory, "with_stack": with_stack,
            "with_flops": with_flops, "with_modules": with_modules}
        schedule = None if schedule is None else _to_torch_action(schedule)  # torch_npu's actions or torch's
        super().__init__(activities=sorted((_to_torch(a) for a in self.npu_activities), key=str), schedule=schedule,
                         on_trace_ready=on_trace_ready, record_shapes=record_shapes, profile_memory=profile_memory,
                         with_stack=with_stack, with_flops=with_flops, with_modules=with_modules)

    def info_config(self) -> dict[str, Any]:
        """The config section of profiler_info.json."""
        return {"common_config": self.npu_common_config, "experimental_config": self.npu_experimental_config.to_info()}

    def export_chrome_trace(self, path: str) -> None:
        """Writes the trace as torch_npu does: its trace_view.json (a JSON array) at ``path``, a .json file."""
        if not str(path).endswith(".json"):
            raise RuntimeError(f"torch_npu.profiler: invalid parameter output_path={path!r}, which must be a json file")
        Path(path).write_text(trace_view.trace_view_json(records.collect(self)))


def _save(prof: profile, dir_name: str | None, worker_name: str | None) -> Path:
    prof_dir = output.new_profiler_dir(dir_name, worker_name)
    output.save_raw(prof_dir, records.collect(prof), prof.info_config(),
                    {"torch_npu_version": __version__, "cann_version": get_cann_version()})
    return prof_dir


def tensorboard_trace_handler(dir_name: str | None = None, worker_name: str | None = None, analyse_flag: bool = True,
                              async_mode: bool = False) -> Callable[[profile], None]:
    """The ``on_trace_ready`` that writes each trace to a new ``<worker>_<time>_ascend_pt`` directory under
    ``dir_name`` and, with ``analyse_flag``, its ASCEND_PROFILER_OUTPUT views (else call ``analyse`` later).
    ``async_mode`` is accepted; npusim's analysis is quick and runs in the handler."""
    if not isinstance(analyse_flag, bool):
        warnings.warn("torch_npu.profiler: analyse_flag is not bool, set by default.", stacklevel=2)
        analyse_flag = True

    def handler_fn(prof: profile) -> None:
        prof_dir = _save(prof, dir_name, worker_name)
        if analyse_flag:
            output.analyse(prof_dir)

    return handler_fn


def analyse(profiler_path: str, max_process_number: int | None = None) -> None:
    """Writes the views of an ``*_ascend_pt`` directory saved with ``analyse_flag=False``, or of every such
    directory under ``profiler_path``."""
    path = Path(profiler_path)
    found = [path] if path.name.endswith("_ascend_pt") else sorted(path.glob("*_ascend_pt"))
    if not found:
        raise FileNotFoundError(f"torch_npu.profiler.analyse: no *_ascend_pt directory at {profiler_path}")
    for prof_dir in found:
        output.analyse(prof_dir)
