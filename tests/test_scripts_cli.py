"""The companion scripts' arguments, and what they do without a GPU."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cutile_fmha.assets import fmha_autotune as autotune
from cutile_fmha.assets import fmha_backward_benchmark as backward
from cutile_fmha.assets import fmha_decode_benchmark as decode
from cutile_fmha.assets import fmha_fp8_benchmark as fp8
from cutile_fmha.assets import fmha_optimization_tutorial as tutorial
from cutile_fmha.assets import fmha_scaling_analysis as scaling
from cutile_fmha.platforms import TileShape, TunedLaunch
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.platforms.entry import DECODE_GUESS
from cutile_fmha.assets import fmha_varlen_benchmark as varlen
from cutile_fmha.assets import measure
from cutile_fmha.steps import STEPS

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["assets/fmha_optimization_tutorial.py", "assets/fmha_scaling_analysis.py",
           "assets/fmha_autotune.py", "assets/fmha_backward_benchmark.py",
           "assets/fmha_llama_demo.py", "assets/fmha_varlen_benchmark.py",
           "assets/fmha_fp8_benchmark.py", "assets/fmha_variants_benchmark.py",
           "assets/fmha_context_parallel_benchmark.py", "assets/fmha_decode_benchmark.py"]


def test_tutorial_defaults_are_the_guides_configuration():
    args = tutorial.parse_args([])
    assert (args.batch, args.head_dim, args.seq_len) == (4, 128, 2048)
    assert measure.heads_for(args.head_dim, args.heads) == 32
    assert args.causal and args.dtype == "float16" and args.steps == sorted(STEPS)
    assert not args.correctness_check and args.platform is None
    assert args.sdpa_backends == ["flash", "cudnn"]
    # Past D=256 only SDPA's efficient backend runs: it is the baseline there.
    assert tutorial.parse_args(["--head-dim", "512"]).sdpa_backends == ["efficient"]


def test_tutorial_options():
    args = tutorial.parse_args(["--seq-len", "4096", "--no-causal", "--dtype", "bfloat16",
                                "--steps", "1", "6", "--platform", "sm_103", "--head-dim", "64",
                                "--json", "r.json", "--markdown", "r.md", "--iterations", "5",
                                "--sdpa-backends", "cudnn"])
    assert (args.seq_len, args.causal, args.dtype, args.steps) == (4096, False, "bfloat16", [1, 6])
    assert (args.platform, args.head_dim, args.json, args.markdown) == ("sm_103", 64, "r.json", "r.md")
    assert args.sdpa_backends == ["cudnn"] and args.iterations == 5


def test_kv_heads_for_grouped_query_attention():
    assert tutorial.parse_args([]).kv_heads is None
    assert tutorial.parse_args(["--kv-heads", "8"]).kv_heads == 8
    assert scaling.parse_args(["--heads", "16", "--kv-heads", "1"]).kv_heads == 1
    # 32 query heads by default, 16 at D=256: 8 K/V heads divide both.
    assert scaling.parse_args(["--kv-heads", "8"]).kv_heads == 8


def test_default_heads_do_the_same_work_per_token_at_every_head_dim():
    assert [measure.heads_for(d, None) for d in (64, 128, 256)] == [32, 32, 16]
    assert measure.heads_for(256, 8) == 8
    assert measure.describe_heads(None, None) == "H=32 (16 at D=256)"
    assert measure.describe_heads(32, 8) == "H=32 (K/V heads 8)"


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--head-dim", "96"], ["--seq-len", "0"],
                                  ["--platform", "sm_75"], ["--dtype", "float32"],
                                  ["--kv-heads", "5"], ["--kv-heads", "0"]])
def test_tutorial_refuses_bad_options(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        tutorial.parse_args(argv)
    assert exit_.value.code == 2


def test_autotune_defaults_and_options():
    args = autotune.parse_args([])
    assert args.head_dim == [64, 128, 256] and args.seq_len == 8192 and args.output is None
    args = autotune.parse_args(["--head-dim", "128", "--seq-len", "4096", "--output", "e.json"])
    assert (args.head_dim, args.seq_len, args.output) == ([128], 4096, "e.json")
    with pytest.raises(SystemExit):
        autotune.parse_args(["--head-dim", "96"])


def test_autotune_past_head_dim_256_searches_steps_10_and_11_at_ffpas_shape(capsys):
    args = autotune.parse_args(["--head-dim", "512", "1024"])
    assert args.large_head_dims and (args.batch, args.heads) == (1, 48)
    launches = autotune.candidates("sm_90", 1024)
    assert {launch.step for launch in launches} == {10, 11}
    assert {launch.tiles.tile_v for launch in launches} == {256, 512, 1024}
    with pytest.raises(SystemExit):  # the two groups go to separate files
        autotune.parse_args(["--head-dim", "256", "512"])
    assert "separate runs" in capsys.readouterr().err


def test_autotune_searches_the_variable_length_forward_over_step_9s_candidates():
    args = autotune.parse_args(["--varlen", "--head-dim", "64", "128"])
    assert args.varlen and args.batch == 4
    launches = autotune.candidates("sm_90", 128, "varlen")
    assert {launch.step for launch in launches} == {9}
    assert len(launches) == len(autotune.candidates("sm_90", 128)) // 3
    with pytest.raises(SystemExit):
        autotune.parse_args(["--varlen", "--head-dim", "512"])


def test_autotune_searches_the_fp8_forward_over_its_own_space_with_256_key_tiles():
    args = autotune.parse_args(["--fp8", "--dtype", "bfloat16"])
    assert args.kernel == "fp8" and args.head_dim == [64, 128, 256]
    launches = autotune.candidates("sm_90", 128, "fp8")
    assert {launch.step for launch in launches} == {9}
    assert {launch.tiles.tile_n for launch in launches} == {64, 128, 256}
    # a share of the exponentials on the FMA pipes where the tile has 8 columns for it
    assert {(launch.tiles.tile_n, launch.fma_exp2) for launch in launches} == {
        (64, 0), (64, 8), (128, 0), (128, 8), (128, 16), (256, 0), (256, 8), (256, 16)}
    assert {launch.fma_exp2 for launch in autotune.candidates("sm_90", 128)} == {0}
    for argv in (["--fp8", "--varlen"], ["--fp8", "--head-dim", "512"]):
        with pytest.raises(SystemExit):
            autotune.parse_args(argv)


def test_context_parallel_benchmark_defaults_are_the_issues_shapes():
    from cutile_fmha.assets import fmha_context_parallel_benchmark as cp

    args = cp.parse_args([])
    assert (args.batch, args.heads, args.head_dim, args.dtype) == (1, 32, 128, "bfloat16")
    assert args.seq_lens == [32768, 65536, 131072, 262144] and args.masks == ["causal", "full"]
    with pytest.raises(SystemExit):
        cp.parse_args(["--heads", "32", "--kv-heads", "5"])
    assert cp.parse_args(["--ring-sizes", "2", "4"]).ring_sizes == [2, 4]


def test_context_parallel_scaling_is_against_one_gpu_and_the_smallest_ring():
    from cutile_fmha.assets import fmha_context_parallel_benchmark as cp

    four = {"gpus": 4, "fwdbwd_ms": 30.0}
    cp.add_scaling(four, one_gpu_ms=100.0, smallest_ring=(2, 54.0))
    assert four["speedup"] == pytest.approx(100 / 30)
    assert four["efficiency"] == pytest.approx(100 / 30 / 4)
    assert four["efficiency_from_smallest_ring"] == pytest.approx(54 / 30 / 2)
    two = {"gpus": 2, "fwdbwd_ms": 54.0}
    cp.add_scaling(two, one_gpu_ms=None, smallest_ring=(2, 54.0))  # no one-GPU time, itself
    assert set(two) == {"gpus", "fwdbwd_ms"}
    assert cp.ring_groups(None, 1) == {1: None}
    with pytest.raises(ValueError, match="--ring-sizes: 3 does not divide the 4 processes"):
        cp.ring_groups([2, 3], 4)


def test_demo_builds_llama_gemma2_and_gpt_oss_like_models():
    from cutile_fmha.assets import fmha_llama_demo as demo

    assert demo.parse_args([]).architecture == "llama"
    args = demo.parse_args(["--architecture", "gemma2", "--sliding-window", "64"])
    config = demo.model_config(args)
    assert config.attn_logit_softcapping == 50.0 and config.sliding_window == 64
    assert demo.reference_of(args) == "eager"
    config = demo.model_config(demo.parse_args(["--architecture", "gpt-oss"]))
    assert config.num_experts_per_tok == config.num_local_experts == 2
    with pytest.raises(SystemExit):
        demo.parse_args(["--architecture", "mistral"])


def test_demo_generates_with_a_dynamic_or_a_static_compiled_cache():
    from cutile_fmha.assets import fmha_llama_demo as demo

    model = demo.build_models(demo.parse_args(["--layers", "1", "--hidden-size", "64",
                                               "--heads", "4", "--kv-heads", "2",
                                               "--vocab-size", "128"]), "cpu",
                              torch.float32)[0]
    assert demo.parse_args([]).cache == "dynamic"
    demo.configure_generation(model, "static")
    config = model.generation_config
    assert config.cache_implementation == "static"
    assert config.compile_config.mode == "reduce-overhead" and config.compile_config.fullgraph
    demo.configure_generation(model, "dynamic")
    assert config.cache_implementation is None and config.compile_config is None
    with pytest.raises(SystemExit):
        demo.parse_args(["--cache", "offloaded"])


def test_fp8_benchmark_defaults():
    args = fp8.parse_args([])
    assert (args.batch, args.head_dims, args.seq_lens) == (4, [128, 256], [4096, 8192, 16384])
    assert not args.no_fa4 and args.rounds == 3


def test_decode_benchmark_takes_one_new_token_unless_told_more():
    assert decode.parse([]).q_len == [1]
    args = decode.parse(["--q-len", "1", "8", "--batch", "16", "--cache", "4096", "--heads", "32",
                         "--block-sizes", "64"])
    assert list(decode.cases(args)) == [
        (32, 16, 4096, q_len, layout, block) for q_len in (1, 8)
        for layout, block in (("dense", None), ("ragged", None), ("paged", 64))]


def test_autotune_searches_decode_tiles_occupancies_and_split_rules():
    assert autotune.parse_args(["--decode"]).head_dim == [64, 128, 256]
    launches = autotune.decode_candidates(128)
    assert {launch.tile_n for launch in launches} == {64, 128}  # 256 x 128: 64 KB of K
    assert {launch.tile_n for launch in autotune.decode_candidates(256)} == {64}
    assert len(launches) == 2 * len(autotune.DECODE_OCCUPANCIES) * len(
        autotune.DECODE_SPLIT_RULES)
    # what it does not search stays the guess's: the one-wave launch and its tiles
    for head_dim in (64, 128, 256):
        guess = DECODE_GUESS[head_dim]
        assert {(launch.one_wave_columns, launch.one_wave_tiles, launch.one_wave_keys,
                 launch.one_wave_blocks) for launch in autotune.decode_candidates(head_dim)} == {
            (guess.one_wave_columns, guess.one_wave_tiles, guess.one_wave_keys,
             guess.one_wave_blocks)}
    for wrong in (["--decode", "--head-dim", "96"], ["--decode", "--varlen"]):
        with pytest.raises(SystemExit):
            autotune.parse_args(wrong)


def test_autotune_searches_the_backward_kernels_tiles_and_worker_warps():
    args = autotune.parse_args(["--backward", "--head-dim", "128"])
    assert args.backward and args.head_dim == [128]
    assert args.backward_kernels == ("dkdv", "dq", "dkdv_dq")
    candidates = autotune.backward_candidates()
    assert {kernel for kernel, _ in candidates} == {"dkdv", "dq", "dkdv_dq"}
    # "dkdv_dq" with its dQ on time and one turn late
    assert len(candidates) == 4 * len(autotune.BACKWARD_TILES) * len(
        autotune.BACKWARD_WORKER_WARPS)
    # every sm_90 table launch is among the candidates
    table = {(kernel, launch.tiles, launch.num_worker_warps, launch.dq_late)
             for kernels in backward_entry_for("sm_90").launches.values()
             for kernel, launch in kernels.items()}
    assert table <= {(kernel, launch.tiles, launch.num_worker_warps, launch.dq_late)
                     for kernel, launch in candidates}
    args = autotune.parse_args(["--backward", "--backward-kernels", "dkdv_dq"])
    assert {kernel for kernel, _ in autotune.backward_candidates(args.backward_kernels)} == \
        {"dkdv_dq"}
    for wrong in (["--backward", "--head-dim", "512"], ["--backward", "--decode"],
                  ["--backward", "--varlen"], ["--backward", "--backward-kernels", "dkv"],
                  ["--head-dim", "192/128"], ["--backward", "--head-dim", "128/128"],
                  ["--backward", "--head-dim", "196/128"], ["--backward", "--head-dim", "192/x"],
                  ["--backward", "--head-dim", "96"]):
        with pytest.raises(SystemExit):
            autotune.parse_args(wrong)


def test_autotune_searches_exact_head_dim_pairs_in_the_backward():
    args = autotune.parse_args(["--backward", "--head-dim", "192/128", "128"])
    assert args.head_dim == [128, (192, 128)] and not args.table_pairs
    # by default: 64, 128, 256, and then the table's pairs (search_backward adds them)
    args = autotune.parse_args(["--backward"])
    assert args.head_dim == [64, 128, 256] and args.table_pairs
    assert not autotune.parse_args([]).table_pairs


def test_backward_search_times_a_pair_s_candidates_at_that_pair(monkeypatch):
    """The search's wiring, with the timing stubbed: each candidate is the launch the
    backward takes at the pair, "dkdv_dq" running for every call; the fastest is kept."""
    from cutile_fmha.steps.backward import adds_dq_atomically, launches_for
    from cutile_fmha.steps.variants import NO_VARIANTS

    fastest = {"dkdv_dq": (TileShape(64, 128), 4), "dkdv": (TileShape(128, 64), None)}

    def time_of(entry, causal, dims):  # 1 ms for the launch named fastest at 192/128, else 2
        if not isinstance(dims, tuple):
            return 2.0
        name = "dkdv_dq" if adds_dq_atomically(entry, *dims, 1, NO_VARIANTS, causal=causal,
                                               varlen=False) else "dkdv"
        launch = launches_for(entry, *dims)[name]
        return 1.0 if (launch.tiles, launch.num_worker_warps) == fastest[name] else 2.0

    monkeypatch.setattr(autotune, "_backward_workloads", lambda args, head_dims: [
        lambda entry, causal=causal: lambda: time_of(entry, causal, head_dims)
        for causal in (True, False)])
    monkeypatch.setattr(autotune.measure, "time_ms", lambda run, iterations: run())
    compiled = []  # the jobs handed to the parallel compile: every candidate timed after
    monkeypatch.setattr(autotune, "compile_candidates",
                        lambda check, jobs, workers: compiled.extend(jobs) or [None] * len(jobs))
    args = autotune.parse_args(["--backward", "--head-dim", "192/128", "64",
                                "--backward-kernels", "dkdv_dq", "dkdv"])
    best, rows = autotune.search_backward(args, "sm_90", save=lambda best, rows: None)
    assert {key: (launch.tiles, launch.num_worker_warps) for key, launch in best.items()
            if key[0] == (192, 128)} == {
        ((192, 128), kernel): launch for kernel, launch in fastest.items()}
    assert [row["head_dim"] for row in rows if row["kernel"] == "dkdv + dq"] == [64, "192/128"]
    assert [(dims, kernel, launch) for _, dims, kernel, launch, _ in compiled] == [
        (dims, kernel, launch) for dims in args.head_dim
        for kernel, launch in autotune.backward_candidates(args.backward_kernels)]


def test_autotune_keeps_the_launches_its_search_does_not_cover(tmp_path, monkeypatch, capsys):
    """main's wiring, the search stubbed: the file's launches of other head dims stay, with
    the run that measured them, through every save of the search."""
    import json

    from cutile_fmha.platforms import tuned

    context = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-22", "cuda_tile": "1.7.0",
               "tileiras": "13.5", "torch": "2.11.0+cu130", "shape": "B=4 N=8192 float16"}
    path = tmp_path / "sm_90.json"
    earlier = {(128, c): TunedLaunch(9, TileShape(128, 128), 1, 8) for c in (True, False)}
    tuned.write_tuned("sm_90", context, earlier, [], path)
    found = {(64, c): TunedLaunch(8, TileShape(128, 64), 2, 8) for c in (True, False)}

    def search(args, arch, save):
        keys = list(found)
        for done in range(1, len(keys) + 1):  # saved after each point, as the search does
            save({key: found[key] for key in keys[:done]}, [])
        return found, []

    monkeypatch.setattr(autotune, "search", search)
    monkeypatch.setattr(autotune.measure, "gpu_problem", lambda subject: None)
    monkeypatch.setattr(autotune.torch.cuda, "get_device_capability", lambda: (9, 0))
    monkeypatch.setattr(autotune.measure, "run_context", lambda: context | {"date": "2026-11-26"})
    assert autotune.main(["--head-dim", "64", "--output", str(path)]) == 0
    data = json.loads(path.read_text())
    assert [(r["head_dim"], r["causal"]) for r in data["launches"]] == [(64, False), (64, True)]
    assert [[(r["head_dim"], r["causal"]) for r in run["launches"]] for run in data["earlier"]] \
        == [[(128, False), (128, True)]] and data["earlier"][0]["measured"] == context
    assert "kept 2 launches of the run of 2026-11-22" in capsys.readouterr().out


def test_autotune_tunes_the_tuned_steps():
    assert autotune.TUNED_STEPS == [n for n, step in sorted(STEPS.items()) if step.launch == "tuned"]
    assert max(STEPS) in autotune.TUNED_STEPS
    assert {launch.step for launch in autotune.candidates("sm_90", 128)} == {7, 8, 9}


def test_scaling_defaults():
    args = scaling.parse_args([])
    assert args.seq_lens == [1024, 2048, 4096, 8192, 16384]
    assert args.head_dims == [64, 128, 256] and args.dtypes == ["float16"]
    assert args.causal == "both" and args.iterations == 100
    assert args.sdpa_backends == ["flash", "cudnn", "efficient"]
    assert str(args.output_dir).startswith("results/scaling-")


def test_scaling_head_dim_sweep_defaults_to_ffpas_table():
    args = scaling.parse_args(["--head-dim-sweep"])
    assert args.head_dims == [320, 384, 448, 512, 576, 640, 768, 1024]
    assert (args.batch, args.heads, args.seq_lens) == (1, 48, [8192])
    assert args.sdpa_backends == ["efficient"] and args.steps == [10, 11]
    args = scaling.parse_args(["--head-dim-sweep", "--seq-lens", "2048", "16384"])
    assert args.seq_lens == [2048, 16384] and args.head_dims[0] == 320


@pytest.mark.parametrize("argv", [["--seq-lens", "0"], ["--sdpa-backends", "math"],
                                  ["--causal", "maybe"], ["--kv-heads", "3"],
                                  ["--kv-heads", "32"],  # 16 heads at D=256
                                  ["--head-dims", "96"], ["--dtypes", "float32"]])
def test_scaling_refuses_bad_options(argv):
    with pytest.raises(SystemExit):
        scaling.parse_args(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("script", SCRIPTS)
def test_without_a_gpu_one_message_and_a_non_zero_exit(script):
    done = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert "needs a CUDA GPU" in done.stderr and "No CUDA GPU is visible" in done.stderr
    assert "python -m cutile_fmha.platforms.environment" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def load_runner():
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_benchmarks", ROOT / "scripts" / "run_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_platform_scripts_warn_on_another_architecture():
    runner = load_runner()
    assert runner.architecture_warning("sm_90", "sm_90", "NVIDIA H200") is None
    assert runner.architecture_warning(None, "sm_90", "NVIDIA H200") is None
    warning = runner.architecture_warning("sm_121", "sm_90", "NVIDIA H200")
    assert warning.startswith("WARNING: this script is for sm_121, but this GPU is NVIDIA H200 (sm_90)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("benchmark_*.sh")))
def test_platform_scripts_without_a_gpu(script):
    done = subprocess.run(["bash", f"scripts/{script}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert "need a CUDA GPU" in done.stderr and "Traceback" not in done.stderr + done.stdout


def test_backward_benchmark_defaults_are_the_targets_shapes():
    args = backward.parse_args([])
    assert (args.batch, args.head_dim, args.seq_lens) == (4, 128, [4096, 8192, 16384])
    assert args.dtypes == ["float16", "bfloat16"] and args.sdpa_backends == ["flash", "cudnn"]
    with pytest.raises(SystemExit):
        backward.parse_args(["--sdpa-backends", "math"])


def test_varlen_benchmark_packs_the_stated_distribution():
    args = varlen.parse_args([])
    assert (args.tokens, args.min_len, args.max_len) == (65536, 256, 8192)
    assert args.head_dims == [64, 128] and args.dtypes == ["bfloat16"]
    lengths = varlen.sequence_lengths(args.tokens, args.min_len, args.max_len, args.seed)
    assert sum(lengths) == 65536 and all(0 < n <= 8192 for n in lengths)
    assert all(n >= 256 for n in lengths[:-1])  # the last one cut to fit
    assert lengths == varlen.sequence_lengths(65536, 256, 8192, 0)  # seeded
    with pytest.raises(SystemExit):
        varlen.parse_args(["--min-len", "9000"])


def test_benchmarks_time_fa4_unless_told_not_to():
    assert not backward.parse_args([]).no_fa4 and backward.parse_args(["--no-fa4"]).no_fa4
    assert not scaling.parse_args([]).no_fa4 and scaling.parse_args(["--no-fa4"]).no_fa4


def test_autotune_picks_the_best_median_of_the_finalists():
    rows = [{"name": name, "ms": ms} for name, ms in (("a", 1.0), ("b", 1.1), ("c", 1.2),
                                                      ("d", 2.0))]
    later = {"a": [1.5, 1.5], "b": [1.0, 1.0], "c": [1.3, 1.3]}  # "a" was a lucky timing
    fastest = autotune.fastest_finalist(rows, "ms", lambda r: later[r["name"]].pop())
    assert fastest["name"] == "b" and fastest["median_ms"] == 1.0
    assert "median_ms" not in rows[3]  # not a finalist, never timed again
