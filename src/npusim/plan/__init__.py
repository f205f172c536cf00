"""What a training step needs on the chip: the report of ``python -m npusim report`` (and, later, of plan mode).

- :mod:`npusim.plan.tracker`: follows an unmodified script's steps, phases (forward, backward, optimizer)
  and modules with global module and optimizer hooks, and counts the FLOPs it runs.
- :mod:`npusim.plan.analysis`: one rank's report of one step from the profiler's recording (memory events,
  device tasks on the chip clock) and the tracker's marks.
- :mod:`npusim.plan.render`: the table, the memory plot, the files.
- :mod:`npusim.plan.session`: runs a job (a script, as ``npusim run`` does) under all of it and writes the report.

See Note [The step report] in ``plan/session.py`` and docs/PLAN.md, "The report".
"""
