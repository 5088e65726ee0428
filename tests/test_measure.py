"""FLOP counting, the result writers and the plots, on synthetic results (no GPU)."""

import csv
import json

import pytest
import torch

from cutile_fmha.assets import fmha_scaling_analysis as scaling
from cutile_fmha.assets import measure
from cutile_fmha.assets.fmha_optimization_tutorial import add_speedups, columns_for
from cutile_fmha.assets.measure import Column


def test_flops_count_two_products_and_halve_for_causal():
    # B=4, H=32, N=4096, D=128: 4 * 4 * 32 * 4096^2 * 128
    assert measure.attention_flops(4, 32, 4096, 4096, 128, False) == 4 * 4 * 32 * 4096**2 * 128
    assert measure.attention_flops(4, 32, 4096, 4096, 128, True) == 2 * 4 * 32 * 4096**2 * 128
    assert measure.attention_flops(1, 1, 10, 30, 64, False) == 4 * 10 * 30 * 64
    assert measure.Shape(1, 2, 3, 5, 64, False).flops == 4 * 2 * 3 * 5 * 64


def test_tflops():
    assert measure.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert measure.tflops(1.1e12, 2.0) == pytest.approx(550.0)


def test_tolerance_is_twice_sdpa_plus_epsilon():
    import torch

    assert measure.within_tolerance(2e-3, 1e-3, torch.float16)
    assert measure.within_tolerance(3e-3, 1e-3, torch.float16)
    assert not measure.within_tolerance(3.1e-3, 1e-3, torch.float16)
    assert not measure.within_tolerance(float("nan"), 1e-3, torch.float16)


TUTORIAL_ROWS = [
    {"step": 0, "optimization": "PyTorch SDPA (flash)", "latency_ms": 2.0, "tflops": 100.0,
     "first_launch_s": 0.01},
    {"step": 1, "optimization": "Basic cuTile", "latency_ms": 4.0, "tflops": 50.0,
     "first_launch_s": 2.5},
    {"step": 2, "optimization": "+ exp2", "latency_ms": 1.0, "tflops": 200.0,
     "first_launch_s": 1.5},
]


def tutorial_rows():
    rows = [dict(r) for r in TUTORIAL_ROWS]
    add_speedups(rows, {"PyTorch SDPA (flash)": "flash"})
    return rows


def test_speedups_against_step_one_previous_and_sdpa():
    _, basic, exp2 = tutorial_rows()
    assert basic["vs_step1"] == 1.0 and basic["vs_previous"] is None
    assert basic["vs_sdpa_flash"] == 0.5
    assert exp2["vs_step1"] == 4.0 and exp2["vs_previous"] == 4.0 and exp2["vs_sdpa_flash"] == 2.0


def test_text_and_markdown_tables():
    columns = columns_for(["flash"], correctness=False)
    text = measure.format_table(tutorial_rows(), columns)
    assert "Latency (ms)" in text and "4.000" in text and "+ exp2" in text
    lines = measure.format_table(tutorial_rows(), columns, "github").splitlines()
    assert lines[0].startswith("| Step") and set(lines[1]) <= set("|-: ")
    assert "| 2.00 " in lines[4]  # step 2 is twice as fast as SDPA flash
    assert "| -" in lines[2]  # SDPA has no speedup over itself


def test_json_round_trips(tmp_path):
    path = tmp_path / "r.json"
    measure.write_json(path, {"gpu": "test"}, tutorial_rows())
    data = json.loads(path.read_text())
    assert data["context"] == {"gpu": "test"}
    assert data["results"][2]["vs_step1"] == 4.0


def test_csv_has_one_column_per_field(tmp_path):
    path = tmp_path / "r.csv"
    columns = [Column("step", "Step"), Column("latency_ms", "Latency", ".3f")]
    measure.write_csv(path, tutorial_rows(), columns)
    rows = list(csv.DictReader(path.open()))
    assert [r["latency_ms"] for r in rows] == ["2.0", "4.0", "1.0"]
    assert list(rows[0]) == ["step", "latency_ms"]


def test_markdown_file_has_context_and_table(tmp_path):
    path = tmp_path / "r.md"
    measure.write_markdown(path, "Title", {"gpu": "NVIDIA X"}, tutorial_rows(),
                           columns_for(["flash"], correctness=False))
    text = path.read_text()
    assert text.startswith("# Title\n\n- gpu: NVIDIA X\n\n| Step")


def scaling_rows():
    rows = []
    for causal in (True, False):
        for n in (1024, 2048):
            point = {"dtype": "float16", "head_dim": 128, "heads": 32, "causal": causal,
                     "seq_len": n}
            rows.append(point | {"step": 0, "method": "PyTorch SDPA (cudnn)",
                                 "latency_ms": 0.9 * n / 1024, "tflops": 330.0,
                                 "extra_peak_mib": 8.0})
            rows.append(point | {"step": 0, "method": "PyTorch SDPA (flash)",
                                 "latency_ms": 1.0 * n / 1024, "tflops": 300.0,
                                 "extra_peak_mib": 8.0})
            for step, latency in ((6, 0.8), (7, 1.2)):
                rows.append(point | {"step": step, "method": f"step {step}",
                                     "latency_ms": latency * n / 1024, "tflops": 375.0,
                                     "extra_peak_mib": 8.0})
            rows.append(point | {"step": 0, "method": "PyTorch SDPA (math)",
                                 "extra_peak_mib": "OOM" if n == 2048 else 1312.0})
    return rows


def scaling_args(tmp_path, *extra):
    return scaling.parse_args(["--seq-lens", "1024", "2048", "--head-dims", "128",
                               "--output-dir", str(tmp_path), *extra])


CONTEXT = {"gpu": "NVIDIA Test GPU", "arch": "sm_90", "shape": "B=1 H=1"}


def test_scaling_speedups_against_cudnn_and_the_best_backend():
    rows = scaling_rows()[:5]  # one point: cuDNN 0.9 ms, flash 1.0, steps 6 (0.8) and 7 (1.2)
    scaling.add_speedups(rows)
    step6, step7 = rows[2], rows[3]
    assert step6["vs_cudnn"] == pytest.approx(0.9 / 0.8)
    assert step7["vs_best_sdpa"] == pytest.approx(0.9 / 1.2)
    assert not any("vs_cudnn" in r for r in rows if r["step"] == 0)


def test_scaling_speedups_over_fa4_and_fa4_is_never_the_fastest_step(tmp_path):
    # One point with FA4 timed at 0.7 ms: faster than every step, but a baseline.
    rows = scaling_rows()[:5] + [{**scaling_rows()[0], "step": measure.ANCHOR_STEP,
                                  "method": measure.FA4_NAME, "latency_ms": 0.7}]
    scaling.add_speedups(rows)
    step6, fa4 = rows[2], rows[-1]
    assert step6["vs_fa4"] == pytest.approx(0.7 / 0.8)
    assert step6["vs_best_sdpa"] == pytest.approx(0.9 / 0.8)  # FA4 is not an SDPA backend
    assert not any(key.startswith("vs_") for key in fa4)
    args = scaling_args(tmp_path, "--causal", "causal", "--seq-lens", "1024")
    [line], _ = scaling.best_steps(rows, args)
    assert line["n1024"] == "1.12 (step 6)"
    assert "### Speedup over FlashAttention-4" in scaling.report(rows, args, CONTEXT)


def test_fa4_runs_its_causal_mask_only_where_it_is_the_one_asked_for():
    calls = []

    class FakeFA4:
        @staticmethod
        def flash_attn_func(q, k, v, causal):
            calls.append((tuple(q.shape), causal))
            return q, None

    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 4, 12, 16)
    assert measure.fa4_method(FakeFA4, q, k, k, causal=True) is None  # top-left, 8 != 12
    method = measure.fa4_method(FakeFA4, q, k, k, causal="bottom_right")
    assert method.step == measure.ANCHOR_STEP and method.name == measure.FA4_NAME
    assert measure.fa4_method(FakeFA4, q, k, k, causal=False).run().shape == (1, 8, 4, 16)
    assert calls[0] == ((1, 8, 4, 16), True) and calls[-1][1] is False


def test_scaling_report_pivots_and_shows_oom(tmp_path):
    rows = scaling_rows()
    for point in range(0, len(rows), 5):
        scaling.add_speedups(rows[point:point + 5])
    text = scaling.report(rows, scaling_args(tmp_path), CONTEXT)
    best = text.split("## The fastest step against SDPA cuDNN")[1].split("##")[0]
    assert "| float16 | 128 | causal     | 1.12 (step 6) | 1.12 (step 6) |" in best
    causal = text.split("## float16, D=128, H=32, causal")[1].split("\n## ")[0]
    assert "### Speedup over SDPA cuDNN" in causal and "### Speedup over the best SDPA" in causal
    memory = causal.split("### Extra peak memory of one call (MiB)")[1]
    assert "| PyTorch SDPA (math)" in memory and "OOM" in memory and "1312.0" in memory
    tflops = causal.split("### TFLOPS")[1].split("###")[0]
    assert "PyTorch SDPA (math)" not in tflops  # timed for memory only


def test_scaling_writes_every_format_and_valid_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    written = scaling.write_outputs(scaling_rows(), scaling_args(tmp_path), CONTEXT)
    names = sorted(p.name for p in written)
    assert names == ["scaling.csv", "scaling.json", "scaling.md", "speedup_vs_cudnn.png",
                     "tflops_vs_seq_len.png"]
    for png in tmp_path.glob("*.png"):
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert len(list(csv.DictReader((tmp_path / "scaling.csv").open()))) == 20


def test_scaling_without_plots(tmp_path):
    written = scaling.write_outputs(scaling_rows(), scaling_args(tmp_path, "--no-plots"), CONTEXT)
    assert not any(p.suffix == ".png" for p in written)


def test_scaling_rounds_alternate_methods_and_keep_the_median(tmp_path, monkeypatch):
    calls = []
    times = {"cudnn": iter([1.0, 1.2, 0.9]), "step": iter([0.5, 0.7, 0.6])}  # medians 1, 0.6
    found = [measure.Method(0, "PyTorch SDPA (cudnn)", lambda: None, "cudnn"),
             measure.Method(9, "+ Unmasked loop", lambda: None)]
    monkeypatch.setattr(measure, "make_inputs", lambda shape, seed: (None, None, None))
    monkeypatch.setattr(measure, "methods", lambda *a, **k: found)
    monkeypatch.setattr(scaling, "_peak_mib_or_oom", lambda fn: 1.0)

    def time_ms(fn, iterations):
        name = "cudnn" if fn is found[0].run else "step"
        calls.append(name)
        return next(times[name])

    monkeypatch.setattr(measure, "time_ms", time_ms)
    args = scaling_args(tmp_path, "--seq-lens", "1024", "--causal", "causal", "--rounds", "3",
                        "--steps", "9", "--sdpa-backends", "cudnn")
    saved = []
    rows = scaling.sweep(args, save=lambda rows: saved.append(len(rows)))
    assert saved == [len(rows)]  # after every point, so a run stopped early keeps it
    assert calls == ["cudnn", "step", "step", "cudnn", "cudnn", "step"]  # rotated rounds
    step = next(r for r in rows if r["step"] == 9)
    assert step["latency_ms"] == 0.6 and step["spread_pct"] == pytest.approx(100 * 0.2 / 0.6)
    assert step["vs_cudnn"] == pytest.approx(1.0 / 0.6)


def test_rounds_start_one_method_later_each_time():
    assert [measure.rotated("abc", r) for r in range(4)] == [
        list("abc"), list("bca"), list("cab"), list("abc")]
    assert measure.rotated([], 3) == []


def head_dim_sweep_rows():
    """SDPA efficient and steps 10 and 11 at two head dims, causal and not, N=8192."""
    rows = []
    for causal in (True, False):
        for head_dim, ours in ((512, (8.0, 6.0)), (1024, (30.0, 80.0))):
            point = {"dtype": "float16", "head_dim": head_dim, "heads": 48, "causal": causal,
                     "seq_len": 8192}
            point_rows = [point | {"step": 0, "method": "PyTorch SDPA (efficient)",
                                   "latency_ms": 60.0, "tflops": 110.0, "extra_peak_mib": 97.0}]
            point_rows += [point | {"step": step, "method": f"step {step}", "latency_ms": ms,
                                    "tflops": 110.0 * 60.0 / ms, "extra_peak_mib": 96.0}
                           for step, ms in zip((10, 11), ours)]
            scaling.add_speedups(point_rows)
            rows += point_rows
    return rows


def test_head_dim_sweep_reports_ffpas_table_and_plots_against_the_head_dim(tmp_path):
    pytest.importorskip("matplotlib")
    args = scaling.parse_args(["--head-dim-sweep", "--head-dims", "512", "1024",
                               "--output-dir", str(tmp_path)])
    text = scaling.report(head_dim_sweep_rows(), args, CONTEXT)
    table = text.split("### float16, causal, N=8192")[1].split("###")[0]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in table.strip().splitlines()[2:]}
    assert cells["PyTorch SDPA (efficient) (TFLOPS)"] == ["110", "110"]
    assert cells["step 11 (TFLOPS)"] == ["1100", "82"]
    # The fastest step per head dim: 11 at D=512 (60/6 = 10x), 10 at D=1024 (60/30 = 2x).
    assert cells["fastest step"] == ["11", "10"]
    assert cells["fastest step / SDPA efficient"] == ["10.00", "2.00"]
    assert cells["its extra peak memory (MiB)"] == ["96", "96"]
    written = sorted(p.name for p in scaling.write_outputs(head_dim_sweep_rows(), args, CONTEXT))
    assert "tflops_vs_head_dim.png" in written and "speedup_vs_head_dim.png" in written
    assert "tflops_vs_seq_len.png" not in written
