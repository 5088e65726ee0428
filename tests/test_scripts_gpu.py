"""The tutorial, the scaling analysis and the backward benchmark end to end on the GPU, at a
tiny size."""

import json

import pytest
import torch

from cutile_fmha.assets import fmha_backward_benchmark as backward
from cutile_fmha.assets import fmha_optimization_tutorial as tutorial
from cutile_fmha.assets import fmha_scaling_analysis as scaling
from cutile_fmha.steps.definitions import steps_for

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY = ["--batch", "1", "--heads", "2", "--iterations", "3"]


def test_tutorial_end_to_end(tmp_path, capsys):
    status = tutorial.main([*TINY, "--seq-len", "300", "--correctness-check",
                            "--json", str(tmp_path / "t.json"), "--markdown", str(tmp_path / "t.md")])
    assert status == 0
    rows = json.loads((tmp_path / "t.json").read_text())["results"]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == steps_for(128)  # the tutorial's default head dim
    assert all(r["correct"] == "yes" and r["latency_ms"] > 0 for r in steps)
    printed = capsys.readouterr().out
    assert "gpu: " in printed and "platform_entry: " in printed and "+ Approx division" in printed
    assert (tmp_path / "t.md").read_text().startswith("# cuTile FMHA optimization tutorial")


def test_tutorial_past_head_dim_256_runs_steps_10_and_11_against_sdpa_efficient(tmp_path):
    status = tutorial.main([*TINY, "--seq-len", "300", "--head-dim", "512",
                            "--correctness-check", "--json", str(tmp_path / "t.json")])
    assert status == 0
    rows = json.loads((tmp_path / "t.json").read_text())["results"]
    assert [r["optimization"] for r in rows if r["step"] == 0] == ["PyTorch SDPA (efficient)"]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == steps_for(512) == [10, 11]
    assert all(r["correct"] == "yes" and r["vs_sdpa_efficient"] > 0 for r in steps)


def test_tutorial_with_grouped_query_heads(tmp_path, capsys):
    status = tutorial.main(["--batch", "1", "--heads", "4", "--kv-heads", "1", "--iterations", "3",
                            "--seq-len", "300", "--steps", "1", "6", "--correctness-check"])
    assert status == 0
    assert "H=4 (K/V heads 1)" in capsys.readouterr().out


def test_scaling_analysis_end_to_end(tmp_path):
    status = scaling.main([*TINY, "--seq-lens", "128", "256", "--causal", "both",
                           "--head-dims", "64", "128", "--dtypes", "float16", "bfloat16",
                           "--steps", "1", "6", "--rounds", "2", "--output-dir", str(tmp_path)])
    assert status == 0
    rows = json.loads((tmp_path / "scaling.json").read_text())["results"]
    assert all(r["spread_pct"] >= 0 for r in rows if "tflops" in r)
    assert {(r["dtype"], r["head_dim"], r["seq_len"], r["causal"]) for r in rows} == {
        (dtype, d, n, c) for dtype in ("float16", "bfloat16") for d in (64, 128)
        for n in (128, 256) for c in (True, False)}
    math_rows = [r for r in rows if r["method"] == "PyTorch SDPA (math)"]
    assert len(math_rows) == 16 and all(r["extra_peak_mib"] != "OOM" for r in math_rows)
    assert all(isinstance(r["tflops"], float) for r in rows if r["step"] == 6)
    if any(r["method"] == scaling.CUDNN_METHOD and "tflops" in r for r in rows):
        assert all(r["vs_cudnn"] > 0 for r in rows if r["step"] == 6)
    assert "## The fastest step against SDPA cuDNN" in (tmp_path / "scaling.md").read_text()
    for png in ("tflops_vs_seq_len.png", "speedup_vs_cudnn.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_backward_benchmark_end_to_end(tmp_path):
    status = backward.main(["--batch", "1", "--heads", "2", "--seq-lens", "256", "--dtypes",
                            "bfloat16", "--rounds", "2", "--json", str(tmp_path / "b.json")])
    assert status == 0
    rows = json.loads((tmp_path / "b.json").read_text())["results"]
    ours = [r for r in rows if r["method"] == backward.CUTILE]
    assert len(ours) == 2 and all(r["tflops"] > 0 and r["vs_flash"] > 0 for r in ours)


def test_varlen_benchmark_end_to_end(tmp_path):
    from cutile_fmha.assets import fmha_varlen_benchmark as varlen

    status = varlen.main(["--tokens", "3000", "--min-len", "100", "--max-len", "1200",
                          "--head-dims", "64", "--heads", "4", "--kv-heads", "2", "--rounds", "2",
                          "--json", str(tmp_path / "v.json")])
    assert status == 0
    rows = json.loads((tmp_path / "v.json").read_text())["results"]
    ours = [r for r in rows if r["method"] == varlen.OURS]
    assert len(ours) == 4 and all(r["tflops"] > 0 and r["vs_dense"] > 0 for r in ours)


def test_decode_benchmark_end_to_end(tmp_path, capsys):
    from cutile_fmha.assets import fmha_decode_benchmark as decode

    path = tmp_path / "decode.json"
    assert decode.main(["--batch", "2", "--cache", "1000", "--heads", "32", "--q-len", "1", "4",
                        "--block-sizes", "64", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [(row["q_len"], row["layout"]) for row in rows] == [
        (q_len, layout) for q_len in (1, 4) for layout in ("dense", "ragged", "paged 64")]
    assert all(row["ours us"] > 0 and row["ours GB/s"] > 0 for row in rows)
    for dense in (rows[0], rows[3]):  # SDPA, with the causal mask at the last key for 4
        assert dense["cuDNN us"] > 0 and dense["flash us"] > 0 and dense["ours / cuDNN time"] > 0
    capsys.readouterr()
    assert decode.main(["--host-time", "--heads", "32"]) == 0
    printed = capsys.readouterr().out
    for name in ("SDPA us", "attention() us", "attention_varlen() us",
                 "attention_with_kvcache() us"):
        assert name in printed
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 5  # header, rule, a row per q_len (1 to 128)


def test_llama_demo_end_to_end(capsys, kernel_calls):
    pytest.importorskip("transformers")
    from cutile_fmha.assets import fmha_llama_demo as demo

    status = demo.main(["--layers", "2", "--hidden-size", "512", "--heads", "4", "--kv-heads",
                        "2", "--vocab-size", "512", "--batch", "2", "--seq-len", "300",
                        "--train-steps", "4", "--new-tokens", "3", "--rounds", "3"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "tokens/s" in printed and printed.rstrip().endswith("OK")
    # two layers, as in test_transformers_backend.py's CPU run of the demo
    assert kernel_calls == {"forward": 2 * (1 + 4 + 4), "backward": 2 * 4,
                            "varlen_forward": 2 * (1 + 4 + 5 + 4), "varlen_backward": 2 * 4,
                            "decode": 2 * 5 * 2}


@pytest.mark.parametrize("architecture", ["gemma2", "gpt-oss"])
def test_softcap_window_and_sink_demos_end_to_end(architecture, capsys, kernel_calls):
    pytest.importorskip("transformers")
    from cutile_fmha.assets import fmha_llama_demo as demo

    status = demo.main(["--architecture", architecture, "--layers", "2", "--hidden-size", "512",
                        "--heads", "4", "--kv-heads", "2", "--vocab-size", "512", "--batch", "2",
                        "--seq-len", "300", "--new-tokens", "3", "--sliding-window", "64"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "packed training" in printed and printed.rstrip().endswith("OK")
    assert kernel_calls["variants"] and kernel_calls["varlen_forward"] and kernel_calls["decode"]
