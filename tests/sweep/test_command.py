"""``primal sweep`` through the CLI's main: one-line errors, plots."""

from __future__ import annotations

import pytest

from primal_compiler.cli import main as cli_main
from primal_compiler.sweep.plot import pareto_front


def main(argv: list[str]) -> int:
    return cli_main(["sweep", *argv])


def test_unreachable_scheduler_fails_before_any_point(tiny_spec, tmp_path, capsys):
    out = tmp_path / "r"
    code = main([str(tiny_spec), "-o", str(out), "--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "0.5"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.startswith("primal: --scheduler: cannot reach the Dask scheduler tcp://127.0.0.1:9")
    assert err.count("\n") == 1
    code = main([str(tiny_spec), "-o", str(out), "--scheduler-file", str(tmp_path / "nope.json")])
    assert code == 2 and "--scheduler-file" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("text, message", [
    ('[axes]\n"rram.adc_bitz" = [4]\n', "rram.adc_bitz: unknown key (did you mean 'adc_bits'?)"),
    ('[axes]\nbatch = []\n', "axes.batch: empty axis"),
    ('[axes]\n"rram.adc_bits" = [4.5]\n', "expected an integer, got float 4.5"),
])
def test_bad_spec_is_one_line_and_writes_nothing(tmp_path, capsys, text, message):
    spec = tmp_path / "s.toml"
    spec.write_text(text)
    out = tmp_path / "r"
    assert main([str(spec), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"primal: {spec}: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_plot_metric_must_be_kept(tiny_spec, tmp_path, capsys):
    assert main([str(tiny_spec), "-o", str(tmp_path / "r"), "--plot", "--x", "ttft_s"]) == 2
    assert "--x: ttft_s is not a kept metric" in capsys.readouterr().err


def test_sweep_and_plot(tiny_spec, tmp_path, capsys):
    out = tmp_path / "r"
    assert main([str(tiny_spec), "-o", str(out), "--workers", "2", "--no-progress", "--plot",
                 "--x", "tokens_per_s", "--y", "power_w"]) == 0
    text = capsys.readouterr().out
    assert "6 points: 6 run now (2 failed), 0 already done" in text
    assert "Pareto front (power_w vs tokens_per_s)" in text
    for name in ("pareto.png", "sensitivity.png"):
        assert (out / "_plots" / name).read_bytes()[:4] == b"\x89PNG"
    import pyarrow.parquet as pq  # the directory reads as it is (pandas.read_parquet reads it through this): the

    assert pq.read_table(out).num_rows == 6  # manifest and the plots start with "_", which readers skip
    assert main([str(tiny_spec), "-o", str(out), "--no-progress"]) == 0
    assert "0 run now (0 failed), 6 already done" in capsys.readouterr().out


def test_pareto_front_directions():
    rows = [{"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 0.5}, {"a": 0.5, "b": 2.0}, {"a": 0.5, "b": 0.5},
            {"a": None, "b": 9.0}]
    assert [(r["a"], r["b"]) for r in pareto_front(rows, "a:max", "b:max")] == [(0.5, 2.0), (1.0, 1.0), (2.0, 0.5)]
    assert [(r["a"], r["b"]) for r in pareto_front(rows, "a:max", "b:min")] == [(2.0, 0.5)]
    assert [(r["a"], r["b"]) for r in pareto_front(rows, "a:min", "b:min")] == [(0.5, 0.5)]
    # tokens_per_* is maximised, power minimised by default
    rows = [{"tokens_per_s": 10.0, "power_w": 5.0}, {"tokens_per_s": 20.0, "power_w": 6.0},
            {"tokens_per_s": 15.0, "power_w": 7.0}]
    front = pareto_front(rows, "tokens_per_s", "power_w")
    assert [r["tokens_per_s"] for r in front] == [10.0, 20.0]


@pytest.mark.parametrize("name, label", [
    ("tokens_per_j", "tokens/J"), ("itl_p99_s", "ITL p99 (s)"), ("rram.leakage_uw", "RRAM leakage (\u00b5W)"),
    ("power_breakdown_w.static", "power breakdown static (W)"), ("h100.tokens_per_s", "H100 tokens/s"),
    ("sram.write_energy_pj_per_bit", "SRAM write energy (pJ/bit)"), ("srpg.gating", "SRPG gating"),
    ("batch", "batch"),
])
def test_figures_label_metrics_and_axes_in_words_with_units(name, label):
    """A sweep's figures read ``tokens/J``, not ``tokens_per_j``; a key's unit suffix becomes its unit."""
    from primal_compiler.sweep.metrics import readable

    assert readable(name) == label


def test_plots_are_never_written_through_a_link_or_over_a_fifo(tiny_spec, tmp_path, capsys):
    """RESULTS/_plots is the sweep's own, replaced whole as every output is: a symbolic link there (to a user's
    directory), or a directory holding what the sweep did not write (a FIFO named like a plot), is refused in one
    line, and nothing is written through it."""
    import os

    out = tmp_path / "r"
    assert main([str(tiny_spec), "-o", str(out), "--no-progress"]) == 0
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (out / "_plots").symlink_to(theirs)
    assert main([str(tiny_spec), "-o", str(out), "--no-progress", "--plot"]) == 2
    assert "_plots: is a symbolic link" in capsys.readouterr().err and not list(theirs.iterdir())
    (out / "_plots").unlink()
    (out / "_plots").mkdir()
    os.mkfifo(out / "_plots" / "pareto.png")
    assert main([str(tiny_spec), "-o", str(out), "--no-progress", "--plot"]) == 2
    assert "_plots: exists and was not written by primal" in capsys.readouterr().err
    assert (out / "_plots" / "pareto.png").is_fifo()
