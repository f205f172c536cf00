"""What npusim's ``torch_npu.profiler`` writes: torch_npu's ``*_ascend_pt`` output, from torch.profiler's events.

``torch_npu.profiler`` (compat/torch_npu/package/profiler/) is torch.profiler with torch_npu's API; when a
trace is ready, :mod:`.records` turns the profiler's events into plain records on the chip's clock,
:mod:`.output` lays out the directory, and :mod:`.tables`, :mod:`.trace_view` and :mod:`.communication`
write the views, with the step figures of :mod:`npusim.runtime.overlap` (steps: :mod:`.steps`).
"""

# Note [What npusim's torch_npu.profiler writes]
# torch_npu's profiler collects through CANN's msprof (raw data under PROF_*/) and parses it into
# ASCEND_PROFILER_OUTPUT/. npusim has no msprof: its device tasks are torch.profiler device activities
# (Note [Device tasks in torch.profiler]), and the views are computed from those, with torch_npu's file
# names, headers and JSON keys:
# - trace_view.json: host ops and device tasks on one time axis, with the Overlap Analysis rows;
# - kernel_details.csv (Step Id first when there are steps), operator_details.csv, step_trace_time.csv
#   (Note [Overlap Analysis figures]); with profiler_level Level1 or Level2 also op_statistic.csv and,
#   when collectives ran, communication.json, as torch_npu writes them only from Level1 on;
# - profiler_info.json / profiler_info_<rank>.json, and FRAMEWORK/npusim_records.json, npusim's raw data
#   (what torch_npu.profiler.analyse reads after tensorboard_trace_handler(analyse_flag=False)).
# What npusim cannot write, because its source is CANN's hardware or tools:
# - AI Core PMU metrics (experimental_config aic_metrics other than AiCMetrics.AiCoreNone: pipe
#   utilisation, arithmetic utilisation, memory bandwidths, resource conflicts, L2 cache), l2_cache,
#   sys_io, sys_interconnection, host_sys, msprof_tx / mstx ranges and the GC lane (gc_detect_threshold):
#   refused by name when asked for (torch_npu.profiler.experimental_config);
# - the db export (ExportType.Db: ascend_pytorch_profiler_<rank>.db, analysis.db): refused by name;
# - msprof's raw data (PROF_*/, its mindstudio_profiler_output/), api_statistic.csv (CANN's API layer),
#   communication_matrix.json (link-level transfers), memory_record.csv / operator_memory.csv /
#   npu_module_mem.csv (torch.profiler's memory events remain in export_memory_timeline), the dynamic
#   profiler (dynamic_profile) and export_stacks' NPU metric: not written.
# Values npusim does not know are written as torch_npu writes an absent figure: Block Num 0, and in
# communication.json a collective's whole span as Transit Time (no wait or synchronisation split) and
# sizes and bandwidths 0.
