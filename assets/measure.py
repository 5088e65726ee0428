"""Timing, FLOP counting, inputs and the SDPA baselines: the one place both companion
scripts (and the GPU tests) take them from.

Timing follows the playbook's method: fresh random inputs, warm-up first, then the
median of many runs, each replayed from a CUDA graph (triton's do_bench_cudagraph) so
launch overhead stays out of the number; CUDA events when triton is missing.
"""

import argparse
import csv
import datetime
import functools
import json
import statistics
from dataclasses import dataclass
from typing import Callable

import cuda.tile as ct
import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from ..platforms import HEAD_DIMS, LARGE_HEAD_DIMS, PLATFORMS, arch_of_capability
from ..platforms.environment import check, find_compiler
from ..steps import STEPS, attention, steps_for

# The SDPA backends we compare against, by the names the tables use.
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
TIMED_SDPA_BACKENDS = [name for name in SDPA_BACKENDS if name != "math"]  # math: memory only
SDPA_STEP = 0  # the step number of SDPA's rows in every result table
ANCHOR_STEP = -1  # the step number of another library's rows (FlashAttention-4)
FA4_NAME = "FlashAttention-4"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    q_len: int
    k_len: int
    head_dim: int
    causal: bool | str  # False, True ("top_left") or "bottom_right", as the launcher takes it
    dtype: str = "float16"
    kv_heads: int | None = None  # K/V heads (grouped-query attention); None: as many as heads

    @property
    def flops(self) -> float:
        return attention_flops(self.batch, self.heads, self.q_len, self.k_len,
                               self.head_dim, self.causal)


def attention_flops(batch, heads, q_len, k_len, head_dim, causal) -> float:
    """Two matrix products of 2*q_len*k_len*head_dim each per head; causal does half."""
    flops = 4.0 * batch * heads * q_len * k_len * head_dim
    return flops / 2 if causal else flops


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def make_inputs(shape: Shape, seed: int = 0, device="cuda"):
    """Fresh standard-normal q, k, v (never zeros: they hide unwritten outputs)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[shape.dtype]

    def randn(heads, length):
        return torch.randn(shape.batch, heads, length, shape.head_dim,
                           generator=generator, device=device, dtype=dtype)

    kv_heads = shape.kv_heads or shape.heads
    return randn(shape.heads, shape.q_len), randn(kv_heads, shape.k_len), \
        randn(kv_heads, shape.k_len)


TOLERANCE_EPSILON = {torch.float16: 1e-3, torch.bfloat16: 4e-3}  # about half an ulp at 1.0


def within_tolerance(error: float, sdpa_error: float, dtype: torch.dtype) -> bool:
    """The playbook's bar: at most twice SDPA's own error, plus a small epsilon."""
    return error <= 2 * sdpa_error + TOLERANCE_EPSILON[dtype]


def sdpa(q, k, v, *, causal: bool | str, backend: str | None = None):
    """PyTorch SDPA on the same problem, with one backend forced (None: PyTorch's own
    choice): grouped-query heads through enable_gqa, "bottom_right" through
    causal_lower_right."""
    options = {"enable_gqa": q.shape[1] != k.shape[1]}
    if causal == "bottom_right":
        options["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
    else:
        options["is_causal"] = bool(causal)
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **options)
    with sdpa_kernel(SDPA_BACKENDS[backend]):
        return F.scaled_dot_product_attention(q, k, v, **options)


def sdpa_supports(q, k, v, *, causal: bool | str, backend: str) -> bool:
    """Whether `backend` runs these inputs on this GPU (it raises when it can't)."""
    try:
        sdpa(q, k, v, causal=causal, backend=backend)
        torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


@dataclass(frozen=True)
class Method:
    """One thing to time: an SDPA backend (step 0), FlashAttention-4 (ANCHOR_STEP) or a
    tutorial step."""
    step: int
    name: str
    run: Callable[[], torch.Tensor]  # one call, allocating its output like SDPA does
    backend: str | None = None  # the SDPA backend, for step 0


def add_fa4_argument(parser: argparse.ArgumentParser) -> None:
    """--no-fa4, for the scripts that time FlashAttention-4 with the others."""
    parser.add_argument("--no-fa4", action="store_true",
                        help="leave FlashAttention-4 out (timed by default where "
                             "flash_attn.cute is importable: ../shared/gpu/make-fa4-bundle.sh)")


def fa4_unless(args: argparse.Namespace, context: dict | None = None):
    """flash_attn.cute, or None under --no-fa4 or where it is not importable; `context`
    (a run's) then says whether FA4 was timed."""
    fa4 = None if args.no_fa4 else flash_attention_4()
    if context is not None:
        context["fa4"] = "timed" if fa4 else "not timed"
    return fa4


def one_line(error: Exception, width: int = 120) -> str:
    """An exception as one line of at most about `width` characters: its type and the
    first line of its message."""
    message = str(error).splitlines()[0][:width] if str(error) else ""
    return f"{type(error).__name__}: {message}"


def fa4_inputs(q, k, v) -> list[torch.Tensor]:
    """(B, H, N, D) inputs in FlashAttention-4's layout, (B, N, H, D) contiguous: copied
    once, outside the timings, as leaves that require grad where the inputs do."""
    return [t.detach().transpose(1, 2).contiguous().requires_grad_(t.requires_grad)
            for t in (q, k, v)]


def fa4_forward(fa4, q, k, v, *, causal: bool) -> Callable[[], torch.Tensor]:
    """One FlashAttention-4 forward of inputs in its layout (fa4_inputs): its output."""
    return lambda: fa4.flash_attn_func(q, k, v, causal=causal)[0]


def fa4_method(fa4, q, k, v, *, causal: bool | str) -> Method | None:
    """FlashAttention-4 on these (B, H, N, D) inputs, or None where it does not run them
    (saying why in one line where it raises). Its causal mask is the bottom-right one: the
    top-left one only where q_len == k_len."""
    if causal in (True, "top_left") and q.shape[2] != k.shape[2]:
        return None
    run = fa4_forward(fa4, *fa4_inputs(q, k, v), causal=causal not in (False, "none"))
    try:
        run()
        if q.is_cuda:  # its errors surface here, not in the timings
            torch.cuda.synchronize()
    except Exception as error:  # a head dim or shape it does not take: a result, not a crash
        print(f"{FA4_NAME} left out at {tuple(q.shape)}: {one_line(error)}")
        return None
    return Method(ANCHOR_STEP, FA4_NAME, run)


def methods(q, k, v, *, causal: bool | str, steps, sdpa_backends, platform=None,
            fa4=None) -> list[Method]:
    """The SDPA backends that run these inputs here, FlashAttention-4 where `fa4` (its
    module) is given and runs them, then those of the chosen steps that run this head
    dim."""
    found = [Method(SDPA_STEP, f"PyTorch SDPA ({backend})",
                    functools.partial(sdpa, q, k, v, causal=causal, backend=backend), backend)
             for backend in sdpa_backends
             if sdpa_supports(q, k, v, causal=causal, backend=backend)]
    anchor = fa4_method(fa4, q, k, v, causal=causal) if fa4 is not None else None
    found += [anchor] if anchor else []
    return found + [Method(step, STEPS[step].name,
                           functools.partial(attention, q, k, v, causal=causal, step=step,
                                             platform=platform))
                    for step in steps_for(q.shape[-1], steps)]


def _time_with_events(fn, iterations: int) -> float:
    for _ in range(max(3, iterations // 10)):  # warm-up
        fn()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


MIN_REPLAY_MS = 25.0


def time_ms(fn, iterations: int = 100) -> float:
    """Median milliseconds of one `fn()` call, after warm-up, over about `iterations` calls."""
    fn()  # first call compiles or picks kernels; keep it out of the graph and the timing
    torch.cuda.synchronize()
    try:
        from triton.testing import do_bench_cudagraph
    except ImportError:
        return _time_with_events(fn, iterations)
    # do_bench_cudagraph replays a graph of rep/estimate calls 10 times and returns the
    # median of those 10 means: give it about `iterations` calls in all, and at least
    # MIN_REPLAY_MS per replay so that short kernels run long enough to reach steady clocks.
    estimate = _time_with_events(fn, 3)
    return do_bench_cudagraph(fn, rep=max(MIN_REPLAY_MS, estimate * iterations / 10),
                              return_mode="median")


def rotated(items, start: int) -> list:
    """`items` in order from position `start` (modulo their number), then from the first."""
    items = list(items)
    start %= max(len(items), 1)
    return items[start:] + items[:start]


def time_in_rounds(fns: list, rounds: int, time, after_each=lambda: None) -> list[list]:
    """Each of `fns` timed by `time(fn)` once per round, in turn, each round starting one
    later: a kernel timed right after a heavy one runs at lower clocks (power and heat), so
    no fn keeps the worst place, and the median of the rounds drops a stray timing. A fn
    whose timing came back as a string ("OOM") is not timed again. Returns each fn's
    timings; `after_each()` runs after every place in a round (progress)."""
    timings = [[] for _ in fns]
    for round_ in range(rounds):
        for index in rotated(range(len(fns)), round_):
            if not any(isinstance(t, str) for t in timings[index]):
                timings[index].append(time(fns[index]))
            after_each()
    return timings


def extra_peak_memory(fn) -> int:
    """Peak bytes one `fn()` call allocates beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - baseline


# --- where we ran -----------------------------------------------------------------------

def gpu_problem(subject: str) -> str | None:
    """'<subject> a CUDA GPU ...' and the environment check's message when the kernels
    can't run here (subject: "The tutorial needs"), else None."""
    report = check()
    if not report.problems:
        return None
    return f"{subject} a CUDA GPU that cuTile supports.\n{report.message()}"


def flash_attention_4():
    """FlashAttention-4's interface (``flash_attn.cute``) as an optional anchor, or None,
    saying so in one line, when it is not importable here (../shared/gpu/make-fa4-bundle.sh
    stages it on a GPU host)."""
    try:
        import flash_attn.cute as fa4
    except Exception as error:  # not installed, or its compiler cannot load here
        print(f"FlashAttention-4 (flash_attn.cute) not importable, left out: "
              f"{type(error).__name__}: {error}")
        return None
    return fa4


def run_context(platform_entry=None) -> dict:
    """GPU, architecture, platform entry used (if any) and versions, for result headers."""
    compiler = find_compiler()
    entry = {"platform_entry": platform_entry.describe()} if platform_entry else {}
    return {
        "gpu": torch.cuda.get_device_name(),
        "arch": arch_of_capability(*torch.cuda.get_device_capability()),
        **entry,
        "cuda_tile": ct.__version__,
        "tileiras": ".".join(map(str, compiler.version)) if compiler.version else "unknown",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }


# --- command-line options the programs share ---------------------------------------------

def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def heads_for(head_dim: int, heads: int | None) -> int:
    """--heads, or by default 32: 16 at D=256, which does the same FLOPs per token as 32
    heads at D=128 (the target grid's shapes)."""
    if heads is not None:
        return heads
    return 16 if head_dim == 256 else 32


def add_run_arguments(parser: argparse.ArgumentParser, *, sdpa_backends: list[str],
                      iterations_help: str, sdpa_help: str, sweep: bool = False) -> None:
    """Shape, steps, platform entry and SDPA baselines, as the tutorial and the scaling
    analysis both take them. `sweep`: head dims and dtypes are axes (--head-dims,
    --dtypes), not one value each (--head-dim, --dtype)."""
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--heads", type=positive_int, default=None,
                        help="query heads (default: 32, or 16 at D=256)")
    parser.add_argument("--kv-heads", type=positive_int, default=None,
                        help="K/V heads for grouped-query attention, dividing the query heads "
                             "(default: as many)")
    if sweep:
        parser.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS),
                            choices=HEAD_DIMS + LARGE_HEAD_DIMS)
        parser.add_argument("--dtypes", nargs="+", default=["float16"], choices=sorted(DTYPES))
    else:
        parser.add_argument("--head-dim", type=int, default=128,
                            choices=HEAD_DIMS + LARGE_HEAD_DIMS)
        parser.add_argument("--dtype", default="float16", choices=sorted(DTYPES))
    parser.add_argument("--iterations", type=positive_int, default=100, help=iterations_help)
    parser.add_argument("--steps", type=int, nargs="+", default=sorted(STEPS),
                        choices=sorted(STEPS), help="which steps to run, of those that run the "
                                                    "head dim (default: all)")
    parser.add_argument("--platform", choices=sorted(PLATFORMS) + ["default"],
                        help="use another architecture's table entry (default: this GPU's)")
    parser.add_argument("--sdpa-backends", nargs="+", default=sdpa_backends,
                        choices=TIMED_SDPA_BACKENDS, help=sdpa_help)


def check_run_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What add_run_arguments' options cannot check one by one."""
    if args.kv_heads is None:
        return
    for head_dim in getattr(args, "head_dims", [getattr(args, "head_dim", None)]):
        heads = heads_for(head_dim, args.heads)
        if heads % args.kv_heads:
            parser.error(f"--kv-heads must divide the query heads, got {args.kv_heads} and "
                         f"{heads}" + ("" if args.heads else f" (the default at D={head_dim})"))


def describe_heads(heads: int | None, kv_heads: int | None) -> str:
    """"H=32", "H=32 (K/V heads 8)" for grouped-query attention, or for heads=None the
    default, "H=32 (16 at D=256)"."""
    text = f"H={heads}" if heads is not None else "H=32 (16 at D=256)"
    return text + (f" (K/V heads {kv_heads})" if kv_heads not in (None, heads) else "")


def describe_shape(shape: Shape) -> str:
    """"B=4 H=32 (K/V heads 8) N=2048 D=128 float16 causal", for result headers."""
    lengths = f"N={shape.q_len}" if shape.q_len == shape.k_len else \
        f"q_len={shape.q_len} k_len={shape.k_len}"
    causal = {False: "non-causal", True: "causal"}.get(shape.causal, f"causal {shape.causal}")
    return (f"B={shape.batch} {describe_heads(shape.heads, shape.kv_heads)} {lengths} "
            f"D={shape.head_dim} {shape.dtype} {causal}")


# --- result formats ---------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    key: str  # the field in each row dict (and the JSON / CSV name)
    header: str  # what tables show
    fmt: str = ""  # format spec for numbers, e.g. ".3f"


def cell(value, fmt: str) -> str:
    """One table cell: a float in `fmt`, "-" for None, anything else as it is."""
    if value is None:
        return "-"
    if isinstance(value, float) and fmt:
        return format(value, fmt)
    return str(value)


def format_table(rows: list[dict], columns: list[Column], tablefmt: str = "simple") -> str:
    """Rows as a text table ("simple") or a Markdown table ("github")."""
    body = [[cell(row.get(c.key), c.fmt) for c in columns] for row in rows]
    return tabulate(body, headers=[c.header for c in columns], tablefmt=tablefmt,
                    disable_numparse=True)


def format_context(context: dict) -> str:
    return "\n".join(f"{key}: {value}" for key, value in context.items())


def write_json(path, context: dict, rows: list[dict]) -> None:
    with open(path, "w") as f:
        json.dump({"context": context, "results": rows}, f, indent=2)
        f.write("\n")


def write_csv(path, rows: list[dict], columns: list[Column]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[c.key for c in columns], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_markdown(path, title: str, context: dict, rows: list[dict],
                   columns: list[Column]) -> None:
    context_lines = "\n".join(f"- {key}: {value}" for key, value in context.items())
    with open(path, "w") as f:
        f.write(f"# {title}\n\n{context_lines}\n\n{format_table(rows, columns, 'github')}\n")


def add_result_arguments(parser: argparse.ArgumentParser) -> None:
    """--json and --markdown, where ``report`` writes a run's table."""
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="write the results as Markdown")


def report(args: argparse.Namespace, title: str, context: dict, rows: list[dict],
           columns: list[Column]) -> None:
    """Prints a run's context and table, and writes them where --json and --markdown say."""
    print(format_context(context))
    print(format_table(rows, columns))
    if args.json:
        write_json(args.json, context, rows)
    if args.markdown:
        write_markdown(args.markdown, title, context, rows, columns)
