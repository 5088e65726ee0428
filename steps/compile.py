"""Compile steps ahead of time, for any architecture, without a GPU.

    python -m cutile_fmha.steps.compile --arch sm_90 --arch sm_103
    python -m cutile_fmha.steps.compile --arch sm_90 --resources   # registers, spills
                                                                   # (needs cuobjdump)

Each step is compiled to a cubin with the tile sizes and occupancy of the target
architecture's platform entry, exactly as the launcher would launch it there, for sequence
lengths that are multiples of 16 (``--any-length``: for the others).
"""

import argparse
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cuda.tile as ct
from cuda.tile.compilation import export_kernel

from ..kernels import decode as decode_kernels
from ..kernels import fp8 as fp8_kernels
from ..kernels import padding as padding_kernels
from ..kernels import varlen as varlen_kernels
from ..platforms import HEAD_DIMS, LARGE_HEAD_DIMS, PLATFORMS, PlatformEntry, entry_for
from ..platforms.backward import backward_entry_for
from ..platforms.environment import arch_problem, check_compiler, find_compiler, find_cuda_tool
from .backward import BACKWARD_FAMILIES, backward_kernel, gradient_launch
from .definitions import STEPS, steps_for
from .decode import DecodeShape, decode_plan
from .family import (DECODE, FORWARD_FP8, FORWARD_VARIANTS, FP8_QUANTIZE, MERGE_SPLITS,
                     PADDING_RUNS, ROWS_MULTIPLE, KernelFamily, forward_constants, packed)
from .fp8 import fp8_kernel, quantize_settings
from .padding import TILE as PADDING_TILE
from .variants import NO_VARIANTS, Variants, variants_kernel
from .launcher import kernel_for
from .varlen import VARLEN_BACKWARD_FAMILIES, forward_kernel

CT_DTYPES = {"float16": ct.float16, "bfloat16": ct.bfloat16,
             "float8_e4m3fn": ct.float8_e4m3fn,
             # padding masks' (compile_padding_runs)
             "bool": ct.bool_, "int32": ct.int32, "int64": ct.int64}


def export_cubin(kernel, family: KernelFamily, *, dtype: str, constants: dict,
                 arch: str, rows_multiple: int = 1) -> bytes:
    """`kernel`'s cubin for `arch`, called as `family` describes, with `dtype` inputs and
    sequence rows a multiple of `rows_multiple` (a dense family's: ``ROWS_MULTIPLE``)."""
    buffer = io.BytesIO()
    export_kernel(kernel, [family.signature(CT_DTYPES[dtype], constants, rows_multiple)], buffer,
                  gpu_code=arch, output_format="cubin")
    return buffer.getvalue()


def compile_step(step: int, arch: str, *, dtype: str, head_dim: int, causal: bool,
                 write_lse: bool = False, query_group: int = 1,
                 entry: PlatformEntry | None = None,
                 rows_multiple: int = ROWS_MULTIPLE) -> bytes:
    """The cubin of `step` for `arch`, with the tiles and hints the launcher would use
    there (that architecture's table entry and its tuned launches, or `entry`), for
    sequence lengths that are multiples of `rows_multiple` (1: any length)."""
    tiles, hints = STEPS[step].launch_config(entry or entry_for(arch), native=entry is None,
                                             head_dim=head_dim, causal=causal)
    constants = forward_constants(head_dim, tiles, query_group=query_group, causal=causal,
                                  write_lse=write_lse)
    return export_cubin(kernel_for(step, hints), STEPS[step].family, dtype=dtype,
                        constants=constants, arch=arch, rows_multiple=rows_multiple)


def compile_backward(name: str, arch: str, *, dtype: str, head_dim: int, causal: bool,
                     query_group: int = 1, variants: Variants = NO_VARIANTS,
                     value_head_dim: int | None = None, add_to_dkdv: bool = False,
                     delta_from_out: bool = True,
                     rows_multiple: int = ROWS_MULTIPLE) -> bytes:
    """The cubin of the backward's "dkdv", "dq" or "dkdv_dq" kernel for `arch`, at that
    architecture's backward launch (platforms/backward.py), with the softcap and window of
    `variants` compiled in; V's head dim `value_head_dim` (default head_dim), both as the
    launcher tiles them (``gradient_launch``); `add_to_dkdv`: dK/dV added to float32 sums,
    as the launcher's chunks of queries after the first run it; `delta_from_out`: dQ
    writes Delta, as it does unless the caller made Delta (for the sinks' gradient);
    sequence lengths multiples of `rows_multiple`."""
    launch, constants = gradient_launch(backward_entry_for(arch), name, head_dim,
                                        value_head_dim or head_dim, query_group=query_group,
                                        causal=causal, variants=variants,
                                        add_to_dkdv=add_to_dkdv, delta_from_out=delta_from_out)
    return export_cubin(backward_kernel(name, launch.num_worker_warps), BACKWARD_FAMILIES[name],
                        dtype=dtype, constants=constants, arch=arch, rows_multiple=rows_multiple)


def compile_varlen(name: str, arch: str, *, dtype: str, head_dim: int, causal: bool,
                   write_lse: bool = False, query_group: int = 1,
                   entry: PlatformEntry | None = None,
                   variants: Variants = NO_VARIANTS,
                   value_head_dim: int | None = None, packed_tensors: bool = False,
                   cumulative_bounds: bool = True) -> bytes:
    """The cubin of a variable-length kernel ("fmha" for the forward at any head dim, with
    `variants` up to D=256; "dkdv" or "dq", kernels/varlen.py, with their softcap and
    window) for `arch`, at the launch the launcher takes there; V's tile width
    `value_head_dim` (default head_dim, up to D=256). `packed_tensors`: the forward as a
    packed call without gradients launches it, on the packed tensors (``packed``).
    `cumulative_bounds`: the bounds as cu_seqlens (attention_varlen's), else as starts and
    ends per sequence (a padded batch's). "dq" writes Delta, as it does without sinks."""
    bounds = {"CUMULATIVE_BOUNDS": cumulative_bounds}
    if name == "fmha":
        kernel, family, constants = forward_kernel(entry or entry_for(arch), head_dim=head_dim,
                                                   causal=causal, query_group=query_group,
                                                   write_lse=write_lse, variants=variants,
                                                   value_head_dim=value_head_dim)
        return export_cubin(kernel, packed(family) if packed_tensors else family, dtype=dtype,
                            constants=constants | bounds, arch=arch)
    launch, constants = gradient_launch(backward_entry_for(arch), name, head_dim,
                                        value_head_dim or head_dim, query_group=query_group,
                                        causal=causal, variants=variants, delta_from_out=True)
    return export_cubin(backward_kernel(name, launch.num_worker_warps, varlen_kernels),
                        VARLEN_BACKWARD_FAMILIES[name], dtype=dtype,
                        constants=constants | bounds, arch=arch)


def compile_fp8(arch: str, *, head_dim: int, causal: bool, write_lse: bool = False,
                query_group: int = 1, entry: PlatformEntry | None = None,
                rows_multiple: int = ROWS_MULTIPLE) -> bytes:
    """The cubin of the FP8 forward (kernels/fp8.py) for `arch`, at the launch the launcher
    takes there, for sequence lengths that are multiples of `rows_multiple`."""
    kernel, constants = fp8_kernel(entry or entry_for(arch), head_dim=head_dim, causal=causal,
                                   query_group=query_group, write_lse=write_lse)
    return export_cubin(kernel, FORWARD_FP8, dtype="float8_e4m3fn", constants=constants,
                        arch=arch, rows_multiple=rows_multiple)


def compile_fp8_quantize(arch: str, *, dtype: str, head_dim: int, transpose: bool) -> bytes:
    """The cubin of to_fp8's quantization (kernels/fp8.py's ``quantize``) for `arch`, of
    `dtype` inputs with `head_dim` columns, in the layout `transpose` asks for."""
    return export_cubin(fp8_kernels.quantize, FP8_QUANTIZE, dtype=dtype,
                        constants=quantize_settings(head_dim, transpose), arch=arch)


def compile_variants(arch: str, *, dtype: str, head_dim: int, causal: bool,
                     variants: Variants, write_lse: bool = False, query_group: int = 1,
                     entry: PlatformEntry | None = None,
                     value_head_dim: int | None = None,
                     rows_multiple: int = ROWS_MULTIPLE) -> bytes:
    """The cubin of the variants' kernel (kernels/variants.py) for `arch` with `variants`
    compiled in, at the launch the launcher takes there; V's tile width `value_head_dim`
    (default head_dim); sequence lengths multiples of `rows_multiple`."""
    kernel, constants = variants_kernel(entry or entry_for(arch), head_dim=head_dim,
                                        causal=causal, query_group=query_group,
                                        write_lse=write_lse, variants=variants,
                                        value_head_dim=value_head_dim)
    return export_cubin(kernel, FORWARD_VARIANTS, dtype=dtype, constants=constants, arch=arch,
                        rows_multiple=rows_multiple)


def compile_padding_runs(arch: str, *, mask_dtype: str) -> bytes:
    """The cubin of the padding-runs kernel (kernels/padding.py) for `arch`, on a mask of
    `mask_dtype` ("bool", "int32" or "int64")."""
    return export_cubin(padding_kernels.padding_runs, PADDING_RUNS, dtype=mask_dtype,
                        constants={"TILE": PADDING_TILE}, arch=arch)


def compile_decode(arch: str, *, dtype: str, head_dim: int, kv_heads: int = 8, group: int = 4,
                   q_len: int = 1, block_size: int | None = None, causal: bool = False,
                   has_starts: bool = False, has_lengths: bool = True, splits: int = 1,
                   write_lse: bool = False, variants: Variants = NO_VARIANTS,
                   value_head_dim: int | None = None) -> tuple[bytes, bytes]:
    """The cubins of the decode kernel and of its split merge for `arch`, at the launch the
    table gives there (kernels/decode.py), with `variants` compiled in; `value_head_dim`:
    V's, if not head_dim."""
    shape = DecodeShape(batch=1, head_dim=head_dim, kv_heads=kv_heads, group=group, q_len=q_len,
                        capacity=splits * 4096, block_size=block_size, causal=causal,
                        has_starts=has_starts, has_lengths=has_lengths, write_lse=write_lse,
                        num_splits=splits, variants=variants, value_head_dim=value_head_dim)
    plan = decode_plan(shape, entry_for(arch).decode[shape.launch_head_dim], sms=132,
                       device=None)
    return (export_cubin(plan.kernel, DECODE, dtype=dtype, constants=plan.constants, arch=arch),
            export_cubin(decode_kernels.merge_splits, MERGE_SPLITS, dtype=dtype,
                         constants=plan.merge_constants, arch=arch))


def _cuobjdump(cubin: bytes, option: str) -> str:
    cuobjdump = find_cuda_tool("cuobjdump")
    if cuobjdump is None:
        raise FileNotFoundError("cuobjdump not found: pip install nvidia-cuda-cuobjdump")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        done = subprocess.run([cuobjdump, option, path], capture_output=True, text=True)
    if done.returncode != 0:  # --dump-sass also needs nvdisasm: pip install nvidia-cuda-nvdisasm
        raise RuntimeError(f"cuobjdump {option} failed: {done.stderr.strip()}")
    return done.stdout


def resource_usage(cubin: bytes) -> str:
    """cuobjdump's line of registers, stack frame (spills) and shared memory."""
    text = _cuobjdump(cubin, "--dump-resource-usage")
    return next((line.strip() for line in text.splitlines() if "REG:" in line), text.strip())


def sass(cubin: bytes) -> str:
    """The machine code of `cubin`, as cuobjdump disassembles it."""
    return _cuobjdump(cubin, "--dump-sass")


def arch_name(text: str) -> str:
    """--arch's type: "sm_" and digits, the spelling cuTile takes."""
    if not re.fullmatch(r"sm_\d{2,3}", text):
        raise argparse.ArgumentTypeError(
            f"expected an architecture name such as sm_90 or sm_100, got {text!r} (cuTile "
            f"takes the plain name and uses the architecture-specific instructions itself)")
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", type=arch_name,
                        help="architecture to compile for, e.g. sm_90 (repeatable; default: "
                             "every table entry; one without an entry gets the default entry)")
    parser.add_argument("--steps", type=int, nargs="+", default=sorted(STEPS),
                        choices=sorted(STEPS), help="steps to compile, at the head dims each "
                                                    "runs (default: all)")
    parser.add_argument("--head-dim", type=int, nargs="+", default=list(HEAD_DIMS),
                        choices=HEAD_DIMS + LARGE_HEAD_DIMS,
                        help="default 64 128 256; past 256 only steps 10-11 run")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="float16")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lse", action="store_true",
                        help="the variant that also writes the log-sum-exp")
    parser.add_argument("--query-group", type=int, default=1,
                        help="query heads per K/V head (grouped-query attention)")
    parser.add_argument("--any-length", action="store_true",
                        help=f"the kernels for sequence lengths that are not multiples of "
                             f"{ROWS_MULTIPLE} (default: those that are, as every length in "
                             f"the tables; a run compiles each for the call's lengths)")
    parser.add_argument("--resources", action="store_true",
                        help="show registers, stack frame and shared memory per kernel (a "
                             "stack frame is local memory: register spills or local arrays)")
    parser.add_argument("--output-dir", type=Path,
                        help="also write each cubin there, for cuobjdump --dump-sass")
    args = parser.parse_args(argv)
    report = check_compiler()
    if report.problems:
        print(report.message(), file=sys.stderr)
        return 1
    failures = 0
    for arch in args.arch or sorted(PLATFORMS):
        if (problem := arch_problem(arch, find_compiler())):
            failures += 1
            print(f"{arch}: {problem}")
            continue
        for head_dim in args.head_dim:
            for step in steps_for(head_dim, args.steps):
                start = time.perf_counter()
                try:
                    cubin = compile_step(step, arch, dtype=args.dtype, head_dim=head_dim,
                                         causal=args.causal, write_lse=args.lse,
                                         query_group=args.query_group,
                                         rows_multiple=1 if args.any_length else ROWS_MULTIPLE)
                except Exception as error:  # report every failure, keep going
                    failures += 1
                    print(f"{arch} D={head_dim} step {step}: FAILED {type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}")
                    continue
                if args.output_dir:
                    args.output_dir.mkdir(parents=True, exist_ok=True)
                    name = (f"{arch}-{args.dtype}-d{head_dim}-step{step}"
                            f"{'-causal' if args.causal else ''}{'-lse' if args.lse else ''}"
                            f"-group{args.query_group}{'-any-length' if args.any_length else ''}"
                            f".cubin")
                    (args.output_dir / name).write_bytes(cubin)
                try:
                    detail = resource_usage(cubin) if args.resources else f"{len(cubin)} bytes"
                except FileNotFoundError as error:
                    detail = str(error)
                print(f"{arch} D={head_dim} step {step}: ok in "
                      f"{time.perf_counter() - start:.1f}s, {detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
