"""Why a dense cache at D=80 decodes at 78-80% of the HBM peak where D=96 and 128 read at
90-94%: one new token, 32/8 heads, bf16, full lengths, 5 rotating rounds of CUDA-graph
replays. Per shape: the decode kernel at D=80 on the table's launch (D=128's) and on other
key tiles and occupancies, D=96 and 128 on the table's, SDPA cuDNN at D=80, and plain reads
of the same D=80 bytes: a cuTile reader with the decode kernel's grid and TMA loads of
(128, 128) tiles padded from 80 columns, the same reader on tiles of 64 and 16 columns
(two loads a tile, no padding), and a Triton grid-stride loop."""
import dataclasses
import statistics

import cuda.tile as ct
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph

from cutile_fmha import attention_with_kvcache
from cutile_fmha.kernels.common import ConstInt
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward

ROUNDS = 5
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
HEADS, KV_HEADS = 32, 8
ZERO = ct.PaddingMode.ZERO


@ct.kernel(occupancy=2)
def padded_read(K, V, Out, TILE_N: ConstInt, TILE_D: ConstInt):
    kv_head, batch = ct.bid(1), ct.bid(2)
    acc = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    for tile in range(ct.cdiv(K.shape[2], TILE_N)):
        k = ct.load(K, index=(batch, kv_head, tile, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ZERO, latency=4).reshape((TILE_N, TILE_D))
        v = ct.load(V, index=(batch, kv_head, tile, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ZERO, latency=4).reshape((TILE_N, TILE_D))
        acc = acc + k.astype(ct.float32) + v.astype(ct.float32)
    ct.store(Out, index=(batch, kv_head, 0, 0), tile=ct.sum(acc, axis=0).reshape((1, 1, 1, TILE_D)))


@ct.kernel(occupancy=2)
def split_read(K, V, Out, TILE_N: ConstInt):
    """(TILE_N, 64) and (TILE_N, 16) loads of an 80-column cache: no padded columns."""
    kv_head, batch = ct.bid(1), ct.bid(2)
    acc = ct.full((TILE_N, 64), 0.0, dtype=ct.float32)
    acc16 = ct.full((TILE_N, 16), 0.0, dtype=ct.float32)
    for tile in range(ct.cdiv(K.shape[2], TILE_N)):
        ka = ct.load(K, index=(batch, kv_head, tile, 0), shape=(1, 1, TILE_N, 64),
                     padding_mode=ZERO, latency=4).reshape((TILE_N, 64))
        kb = ct.load(K, index=(batch, kv_head, tile, 4), shape=(1, 1, TILE_N, 16),
                     padding_mode=ZERO, latency=4).reshape((TILE_N, 16))
        va = ct.load(V, index=(batch, kv_head, tile, 0), shape=(1, 1, TILE_N, 64),
                     padding_mode=ZERO, latency=4).reshape((TILE_N, 64))
        vb = ct.load(V, index=(batch, kv_head, tile, 4), shape=(1, 1, TILE_N, 16),
                     padding_mode=ZERO, latency=4).reshape((TILE_N, 16))
        acc = acc + ka.astype(ct.float32) + va.astype(ct.float32)
        acc16 = acc16 + kb.astype(ct.float32) + vb.astype(ct.float32)
    ct.store(Out, index=(batch, kv_head, 0, 0), tile=ct.sum(acc, axis=0).reshape((1, 1, 1, 64)))
    ct.store(Out, index=(batch, kv_head, 0, 4), tile=ct.sum(acc16, axis=0).reshape((1, 1, 1, 16)))


@triton.jit
def triton_read(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * BLOCK, n, programs * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def main():
    print(torch.cuda.get_device_name(), flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    table = entry_for("sm_90").decode[128]
    print("table launch (D=128's):", table, flush=True)
    for batch, keys in [(16, 32768), (64, 8192), (16, 4096), (1, 32768)]:
        g = torch.Generator(device="cuda").manual_seed(batch + keys)
        calls, nbytes = {}, {}
        tensors = {}
        for d in (80, 96, 128):
            q = torch.randn(batch, HEADS, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(batch, KV_HEADS, keys, d, device="cuda", dtype=torch.bfloat16,
                                generator=g) for _ in range(2))
            tensors[d] = (q, k, v)
            calls[f"D={d} table"] = (lambda q=q, k=k, v=v: attention_with_kvcache(q, k, v))
            nbytes[f"D={d} table"] = 2 * k.numel() * 2
        q, k, v = tensors[80]
        shape = DecodeShape(batch=batch, head_dim=80, kv_heads=KV_HEADS, group=HEADS // KV_HEADS,
                            q_len=1, capacity=keys, block_size=None, causal=False,
                            has_starts=False, has_lengths=False, write_lse=False,
                            num_splits=None)
        for tile_n, occupancy in [(64, 2), (64, 3), (128, 1), (128, 3), (256, 1)]:
            launch = dataclasses.replace(table, tile_n=tile_n, occupancy=occupancy)
            calls[f"D=80 tile {tile_n} occ {occupancy}"] = (
                lambda launch=launch: decode_forward(q, k, v, shape, scale=80 ** -0.5,
                                                     launch=launch)[0])

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        calls["D=80 cuDNN"] = cudnn
        out = torch.empty(batch, KV_HEADS, 1, 128, device="cuda", dtype=torch.float32)
        calls["D=80 cuTile read, 128x128 padded"] = lambda: ct.launch(
            torch.cuda.current_stream(), (1, KV_HEADS, batch), padded_read, (k, v, out, 128, 128))
        out80 = torch.empty(batch, KV_HEADS, 1, 80, device="cuda", dtype=torch.float32)
        calls["D=80 cuTile read, 128x64 + 128x16"] = lambda: ct.launch(
            torch.cuda.current_stream(), (1, KV_HEADS, batch), split_read, (k, v, out80, 128))
        both = torch.stack([k, v])
        flat = both.view(-1)
        partial = torch.empty(8 * sms, device="cuda", dtype=torch.float32)
        calls["D=80 triton read"] = lambda flat=flat: triton_read[(8 * sms,)](
            flat, partial, flat.numel(), BLOCK=4096, num_warps=8)
        for label in calls:
            nbytes.setdefault(label, 2 * k.numel() * 2)
        reference = attention_with_kvcache(q, k, v).float()
        for label, fn in list(calls.items()):
            try:
                result = fn()
                if label.startswith("D=80") and "read" not in label:
                    diff = (result.float() - reference).abs().max().item()
                    print(f"  {label}: max |diff| from the table's {diff:.2e}", flush=True)
            except Exception as error:
                print(f"  {label} failed: {str(error).splitlines()[0][:200]}", flush=True)
                del calls[label]
        times = {label: [] for label in calls}
        for r in range(ROUNDS):
            order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
            for label in order:
                times[label].append(do_bench_cudagraph(calls[label], rep=30))
        for label in calls:
            med = statistics.median(times[label])
            print(f"batch {batch} x {keys}: {label:36s} {med * 1e3:8.1f} us "
                  f"[{min(times[label]) * 1e3:.1f}-{max(times[label]) * 1e3:.1f}] "
                  f"{nbytes[label] / (med * 1e-3) / PEAK * 100:5.1f}% of peak", flush=True)
        del tensors, calls, both, flat
        torch.cuda.empty_cache()


main()
