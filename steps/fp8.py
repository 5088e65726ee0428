"""The FP8 forward's launcher (kernels/fp8.py): float8_e4m3fn Q, K and transposed V, with
dequantization factors, to a bfloat16 output.

The kernel is step 9's loop, so its launch (tiles and hints per head dim, causal or not)
is the platform table's FP8 one where the autotuner has measured it (--fp8), else step
9's. Nothing here reads a device tensor on the host.
"""

import cuda.tile as ct
import torch

from ..kernels import fp8 as kernels
from ..platforms import PlatformEntry
from .decode import power_of_two_at_least
from .definitions import QUERY_TILE_STEP, launch_of
from .family import FORWARD_FP8, FP8_QUANTIZE, UNUSED_ARRAY, forward_constants
from .launcher import (MAX_GRID_YZ, current_stream, device_facts, on_device, past_32_bits,
                       with_hints)

# cuTile's float8 types start with Hopper (sm_89, Ada, has float8 tensor cores, but cuTile
# 1.7 refuses the type there).
FIRST_FP8_ARCH = 90


def has_float8(arch: str) -> bool:
    """Whether cuTile has float8 types on `arch` (sm_90 on)."""
    return int(arch.removeprefix("sm_")) >= FIRST_FP8_ARCH


def check_fp8_arch(arch: str) -> None:
    """A clear error where cuTile has no float8 (before sm_90)."""
    if not has_float8(arch):
        raise ValueError(f"attention_fp8 needs a GPU of sm_{FIRST_FP8_ARCH} or newer (cuTile's "
                         f"float8 types), this one is {arch}")


def fp8_kernel(entry: PlatformEntry, *, head_dim: int, causal: bool, query_group: int,
               write_lse: bool) -> tuple[object, dict]:
    """(kernel with its hints, compile-time constants) of the FP8 forward with `entry`'s
    launch: the autotuner's FP8 one where it has run (with its share of exponentials on
    the FMA pipes), else step 9's (none)."""
    tuned = entry.fp8_tuned.get((head_dim, causal))
    tiles, hints = launch_of(entry, tuned, QUERY_TILE_STEP, head_dim=head_dim, causal=causal)
    return with_hints(kernels.fmha, hints), forward_constants(
        head_dim, tiles, query_group=query_group, causal=causal, write_lse=write_lse) | {
        "FMA_EXP2": tuned.fma_exp2 if tuned else 0}


def fp8_forward(q, k, v_t, q_descale, k_descale, v_descale, *, causal: bool, scale: float,
                with_lse: bool, platform: PlatformEntry | None = None):
    """(out, lse or None) of float8 q (batch, heads, q_len, D), k (batch, kv_heads, k_len,
    D) and v_t (batch, kv_heads, D, k_len rounded up to 16); descales float32, (batch,
    heads) for q, (batch, kv_heads) for k and v. out is bfloat16 like q; under `causal` query
    i sees keys 0..i. Arguments checked by the caller (cutile_fmha.fp8). `platform`: another
    entry than this GPU's."""
    shape = dict(head_dim=q.shape[-1], causal=causal, query_group=q.shape[1] // k.shape[1],
                 write_lse=with_lse)
    if platform is None:
        check_fp8_arch(device_facts(q.device)[0])
        kernel, constants = on_device(fp8_kernel, q.device, **shape)
    else:
        kernel, constants = fp8_kernel(platform, **shape)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32) if with_lse else None
    values = {"Q": q, "K": k, "V": v_t, "Out": out,
              "Lse": lse if with_lse else UNUSED_ARRAY, "QDescale": q_descale,
              "KDescale": k_descale, "VDescale": v_descale, "qk_scale": scale,
              "query_offset": 0, **constants}
    ct.launch(current_stream(q.device), FORWARD_FP8.grid(values), kernel,
              FORWARD_FP8.arguments(values))
    return out, lse


# Elements of X per CTA of to_fp8's quantization (kernels/fp8.py's ``quantize``): 32 rows
# at D=128, at least 16 (a transposed tile's columns, TMA's 16 bytes of float8). On an H100
# (bf16, 4 x 32 x 8192 x 128) 4096 a CTA took 0.175 / 0.184 ms (as it is / transposed),
# 8192 0.236 / 0.246, 16384 0.327 / 0.333; 1024 and 2048 0.159 / 0.186.
QUANTIZE_TILE_ELEMENTS = 4096
QUANTIZE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def quantize_settings(head_dim: int, transpose: bool) -> dict:
    """The quantization kernel's constants for `head_dim`: D rounded up to a power of two,
    rows per CTA, the layout."""
    tile_d = power_of_two_at_least(head_dim)
    return {"TILE_S": max(16, QUANTIZE_TILE_ELEMENTS // tile_d), "TILE_D": tile_d,
            "TRANSPOSE": transpose}


def quantizes_on_the_gpu(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``quantize_fp8`` takes x into out: a CUDA x of a 16- or 32-bit float dtype,
    its last dimension contiguous, on a GPU with cuTile's float8 (sm_90 on), within the
    grid's and cuTile's 32-bit limits, outside a torch.compile trace (anything else, the
    same values in PyTorch operations, which a compiled graph fuses)."""
    return (x.is_cuda and not torch.compiler.is_compiling() and x.dtype in QUANTIZE_DTYPES
            and x.stride(-1) == 1 and x.numel() > 0
            and max(x.shape[:2]) <= MAX_GRID_YZ and not past_32_bits(x)
            and not past_32_bits(out)
            and has_float8(device_facts(x.device)[0]))


def quantize_fp8(x: torch.Tensor, descale: torch.Tensor, out: torch.Tensor, *,
                 transpose: bool) -> None:
    """Writes x (batch, heads, rows, D) / descale (float32 (batch, heads)) in
    float8_e4m3fn into out: x's shape, or with `transpose` (batch, heads, D, rows rounded
    up to 16), zeros past the last row. One launch; ``quantizes_on_the_gpu`` must hold."""
    values = {"X": x, "Descale": descale, "Out": out,
              **quantize_settings(x.shape[-1], transpose)}
    ct.launch(current_stream(x.device), FP8_QUANTIZE.grid(values), kernels.quantize,
              FP8_QUANTIZE.arguments(values))
