"""Benchmarks measure with torch.utils.benchmark, print progress and Compare tables, and write PNG + JSON."""

from __future__ import annotations

import json
import statistics
import sys

import pytest
import torch

from npusim.bench import report
from npusim.tools import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("times", [[3.0, 1.0, 2.0], [4.0, 1.0, 3.0, 2.0], [0.5]])
def test_measurement_median_is_median_of_step_times(times):
    """A Measurement built from per-step times has their median, one run per step, and the labels given."""
    m = report.measurement(times, label="L", sub_label="S", description="D", num_threads=1)
    assert m.median == pytest.approx(statistics.median(times))
    assert m.number_per_run == 1 and m.times == times
    assert (m.task_spec.label, m.task_spec.sub_label, m.task_spec.description) == ("L", "S", "D")


def test_measurement_refuses_no_times():
    """An empty list of times is an error that names the measurement."""
    with pytest.raises(ValueError, match="'L' / 'S' / 'D'"):
        report.measurement([], label="L", sub_label="S", description="D")


def test_compare_prints_a_row_per_sub_label_and_a_column_per_description(capsys):
    """compare() prints PyTorch's Compare table of the measurements."""
    ms = [report.measurement([t * 1e-3], label="table", sub_label=row, description=col, num_threads=1)
          for row, t in (("row a", 1.0), ("row b", 2.0)) for col in ("npu", "cpu")]
    report.compare(ms)
    out = capsys.readouterr().out
    assert "table" in out and "row a" in out and "row b" in out and "npu" in out and "cpu" in out
    assert "Times are in milliseconds (ms)." in out


def test_interleaved_runs_a_fixed_number_of_turns_alternating_who_goes_first():
    """Every function runs warmup + steps times; only the measured ones are kept; the order alternates."""
    calls: list[str] = []
    times = report.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, steps=3, warmup=1)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [len(times["a"]), len(times["b"])] == [3, 3]


def test_repeated_runs_setup_untimed_before_every_run():
    """repeated() gives one raw time per run of `number` calls, each run after a setup call."""
    log: list[str] = []
    m = report.repeated(lambda: log.append("call"), repeats=4, number=2, setup=lambda: log.append("setup"),
                        label="L", sub_label="S", description="D")
    assert log == ["call"] + ["setup", "call", "call"] * 4  # one warm-up call first
    assert len(m.raw_times) == 4 and m.number_per_run == 2


def test_save_plot_writes_a_png(tmp_path, capsys):
    """save_plot writes the figure as a PNG and says where."""
    path = tmp_path / "x.png"
    assert report.save_plot(path, lambda fig: report.bars(fig.subplots(), ["g1", "g2"], {"s": [1.0, 2.0]},
                                                          xlabel="x"))
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert f"plot: {path}" in capsys.readouterr().out


def test_save_plot_without_matplotlib_says_so(tmp_path, capsys, monkeypatch):
    """Without matplotlib no file is written and the message names the missing package and the plot."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    path = tmp_path / "x.png"
    assert not report.save_plot(path, lambda fig: None)
    assert not path.exists()
    assert "matplotlib is not installed (pip install 'npusim[plot]'): x.png not written" in capsys.readouterr().out


def test_bench_matmul_out_has_png_and_json(tmp_path, capsys):
    """bench matmul with tiny settings prints progress and a Compare table, and writes its PNG and JSON."""
    rc = cli.main(["bench", "matmul", "--width", "32", "--batch", "4", "--layers", "1", "--repeats", "3",
                   "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "[1/2] MLP forward+backward" in out and "MLP forward+backward" in out and "npu/cpu ratio" in out
    assert (tmp_path / "matmul.png").read_bytes()[:8] == PNG_MAGIC
    result = json.loads((tmp_path / "matmul.json").read_text())
    assert {"cpu_ms", "npu_ms", "ratio", "grads_equal", "threads"} <= result.keys()
    assert len(result["cpu_times_s"]) == len(result["npu_times_s"]) == 3
    assert result["grads_equal"] is True


def test_bench_fsdp_copy_in_on_two_ranks_has_png_and_json(tmp_path, capsys):
    """A multi-rank benchmark runs its fixed step count on both ranks and writes its PNG and JSON."""
    rc = cli.main(["bench", "fsdp-copy-in", "--dim", "32", "--blocks", "1", "--seq", "8", "--batch", "2",
                   "--steps", "2", "--warmup", "1", "--timeout", "120", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "[4/4] done" in out and "all-gather copy-in host time per step, rank 0 of 2" in out
    assert (tmp_path / "fsdp-copy-in.png").read_bytes()[:8] == PNG_MAGIC
    raw = json.loads((tmp_path / "fsdp-copy-in.json").read_text())
    assert {"args", "rows", "ranks"} <= raw.keys()
    assert [(r["param dtype"], r["config"]) for r in raw["rows"]] == [
        (d, c) for d in ("fp32", "bf16") for c in ("aligned", "legacy", "legacy + patch")]
    assert all(len(rank["fp32|aligned"]) == 2 for rank in raw["ranks"])


def test_sim_cost_times_the_same_steps_on_both_devices(monkeypatch):
    """Each training row asks npu's and CPU's processes for the same untimed and timed step counts, and
    --min-run-time scales the number of processes, never the steps (Note [The same steps on both devices])."""
    import torch

    from npusim.bench import sim_cost

    calls: list[tuple[str, int, str, int, int]] = []

    def fake_process(step, device, threads, untimed, timed):
        calls.append((step, threads, device, untimed, timed))
        return [1e-3 if device == "npu" else 2e-3] * timed

    monkeypatch.setattr(sim_cost, "steps_in_a_fresh_process", fake_process)
    for min_run_time, rounds in ((1.0, 3), (2.0, 6)):
        calls.clear()
        rows, _ = sim_cost._train_rows(min_run_time)
        assert len(rows) == len(sim_cost._STEPS) and all(r.ratio == pytest.approx(0.5) for r in rows)
        assert len(calls) == 2 * rounds * len(sim_cost._STEPS)
        for row in sim_cost._STEPS:
            key = (row.step, row.threads or torch.get_num_threads(), row.untimed, row.timed)
            asked = [(d, u, t) for s, n, d, u, t in calls if (s, n, u, t) == key]
            assert sorted(asked) == sorted([("cpu", row.untimed, row.timed), ("npu", row.untimed, row.timed)] * rounds)


def test_sim_cost_mlp_rows_sit_either_side_of_the_subnormal_onset(monkeypatch):
    """The dispatch-bound MLP row ends before AdamW's state holds any subnormal float, and the late row
    starts after they have appeared (the reason for the two windows)."""
    import torch

    from npusim.bench import sim_cost

    optimizers: list[torch.optim.AdamW] = []

    class RecordingAdamW(torch.optim.AdamW):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            optimizers.append(self)

    monkeypatch.setattr(torch.optim, "AdamW", RecordingAdamW)
    early, late = (r for r in sim_cost._STEPS if r.step == "mlp")
    step = sim_cost._STEP_FNS["mlp"]("cpu")
    (opt,) = optimizers

    def subnormals() -> int:
        tiny = torch.finfo(torch.float32).tiny
        return sum(int(((v.abs() > 0) & (v.abs() < tiny)).sum())
                   for state in opt.state.values() for v in (state["exp_avg"], state["exp_avg_sq"]))

    for _ in range(early.untimed + early.timed):
        step()
    assert subnormals() == 0
    for _ in range(late.untimed - early.untimed - early.timed):
        step()
    assert subnormals() > 1000


def test_sim_cost_steps_of_process_returns_the_timed_steps():
    """`python -m npusim.bench.sim_cost --steps-of` prints one time per timed step, and says how to call it
    when the arguments are wrong."""
    import subprocess

    from npusim.bench import sim_cost

    times = sim_cost.steps_in_a_fresh_process("mlp", "npu", 1, 2, 3)
    assert len(times) == 3 and all(t > 0 for t in times)
    out = subprocess.run([sys.executable, "-m", "npusim.bench.sim_cost", "--steps-of", "mlp", "npu", "1", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "usage: python -m npusim.bench.sim_cost --steps-of" in out.stderr
    out = subprocess.run([sys.executable, "-m", "npusim.bench.sim_cost", "--steps-of", "mlp", "npu", "1", "2", "x"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "THREADS, UNTIMED and TIMED are whole numbers, got ['1', '2', 'x']" in out.stderr


def test_bench_eager_ops_out_has_png_and_json_and_its_routes_hold(tmp_path, capsys):
    """bench eager-ops with tiny settings writes a row per op, its PNG and JSON; each row's route column says
    truly whether the task copied a fresh result into its output."""
    from npusim.bench import eager_ops
    from npusim.runtime import acl

    rc = cli.main(["bench", "eager-ops", "--rows", "32", "--min-run-time", "0.01", "--out", str(tmp_path)])
    assert rc == 0
    assert "npu task writes its result by" in capsys.readouterr().out
    assert (tmp_path / "eager_ops.png").read_bytes()[:8] == PNG_MAGIC
    rows = json.loads((tmp_path / "eager_ops.json").read_text())["rows"]
    assert [r["op"] for r in rows] == [c.name for c in eager_ops.CASES]
    assert all(r["npu_us"] > 0 and r["cpu_us"] > 0 for r in rows)
    for case in eager_ops.CASES:
        call = case.make("npu", 32 * eager_ops.WIDTH)  # 32768 elements: a stream task
        copied = acl.results_copied_into_place()
        call()  # through to its completion
        assert (acl.results_copied_into_place() > copied) == case.route.startswith(eager_ops.COPIED), case.name
