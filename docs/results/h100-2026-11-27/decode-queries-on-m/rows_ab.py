"""(Run against the change's first form, whose DecodeLaunch had rows_tile_n,
rows_occupancy and rows_worker_warps; the kept rule takes tile_n and the launch's own or
wide hints instead, which this run chose between.)

A/B: the decode kernel with the columns on the products' M side (QUERIES_ON_M) against
the committed launch rule, through decode_forward with explicit launches; dense caches,
bf16, causal at the last key. Checks outputs against float64 first (ragged lengths,
left padding, NaN in every unused slot)."""
import dataclasses, statistics, sys, math
import torch, triton
from cutile_fmha.steps.decode import DecodeShape, decode_forward
from cutile_fmha.platforms import entry_for
torch.manual_seed(0)
dev = "cuda"
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
print(name, flush=True)
entry = entry_for("sm_90")

def launches(D, columns):
    base = entry.decode[D]
    out = {"committed": dataclasses.replace(base, rows_columns=None)}
    out["rows occ1 w8"] = dataclasses.replace(base, rows_columns=64, rows_tile_n=base.tile_n,
                                              rows_occupancy=1, rows_worker_warps=8)
    if columns <= 64:
        out["rows occ2 auto"] = dataclasses.replace(base, rows_columns=64, rows_tile_n=base.tile_n,
                                                    rows_occupancy=2, rows_worker_warps=None)
    if D == 128:
        out["rows occ1 w8 n64"] = dataclasses.replace(base, rows_columns=64, rows_tile_n=64,
                                                      rows_occupancy=1, rows_worker_warps=8)
    return out

def reference(q, kc, vc, starts, ends, scale):
    B, H, L, D = q.shape
    G = H // kc.shape[1]
    out = torch.zeros(B, H, L, D, dtype=torch.float64, device=dev)
    for b in range(B):
        s, e = int(starts[b]), int(ends[b])
        k = kc[b, :, s:e].double().repeat_interleave(G, 0)
        v = vc[b, :, s:e].double().repeat_interleave(G, 0)
        sc = q[b].double() @ k.transpose(-1, -2) * scale
        n = e - s
        t = torch.arange(L, device=dev)[:, None]
        kk = torch.arange(n, device=dev)[None, :]
        sc = sc.masked_fill(kk > n - L + t, -math.inf)
        out[b] = torch.nan_to_num(torch.softmax(sc, -1)) @ v
    return out

def make(B, Hq, Hkv, L, N, D, ragged=False, left=False):
    q = torch.randn(B, Hq, L, D, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    ends = torch.full((B,), N, device=dev, dtype=torch.int32)
    starts = torch.zeros(B, device=dev, dtype=torch.int32)
    if ragged:
        ends = torch.randint(max(L, N // 2), N + 1, (B,), device=dev, dtype=torch.int32)
        ends[0] = L  # as few keys as new tokens
    if left:
        starts = torch.randint(0, N // 4, (B,), device=dev, dtype=torch.int32)
        ends = torch.maximum(ends, starts + L)
    for b in range(B):  # NaN in every slot outside the sequence
        kc[b, :, :starts[b]] = float("nan"); vc[b, :, :starts[b]] = float("nan")
        kc[b, :, ends[b]:] = float("nan"); vc[b, :, ends[b]:] = float("nan")
    return q, kc, vc, starts, ends

def shape_of(q, kc, has_starts, splits=None):
    B, Hq, L, D = q.shape
    return DecodeShape(batch=B, head_dim=D, kv_heads=kc.shape[1], group=Hq // kc.shape[1], q_len=L,
                       capacity=kc.shape[2], block_size=None, causal=True, has_starts=has_starts,
                       has_lengths=True, write_lse=False, num_splits=splits)

part = sys.argv[1] if len(sys.argv) > 1 else "all"
if part in ("all", "check"):
    for (B, Hq, Hkv, L, N, D, left) in [(3, 32, 8, 32, 1000, 128, False), (3, 32, 8, 16, 3000, 128, True),
                                        (2, 64, 8, 16, 777, 128, False), (3, 32, 8, 32, 1500, 64, True),
                                        (2, 32, 8, 32, 900, 256, False), (2, 32, 8, 16, 2100, 256, True)]:
        q, kc, vc, starts, ends = make(B, Hq, Hkv, L, N, D, ragged=True, left=left)
        ref = reference(q, kc, vc, starts, ends, D ** -0.5)
        for splits in (1, 3):
            for tag, launch in launches(D, (Hq // Hkv) * L).items():
                if tag.endswith("n64"):
                    continue
                out, _ = decode_forward(q, kc, vc, shape_of(q, kc, True, splits), scale=D ** -0.5,
                                        key_starts=starts, key_ends=ends, launch=launch)
                err = (out.double() - ref).abs().max().item()
                print(f"check B={B} {Hq}/{Hkv} L={L} N={N} D={D} left={left} splits={splits} {tag}: max err {err:.2e}", flush=True)
if part in ("all", "time"):
    shapes = [(1, 32, 8, 32, 32768, 128), (16, 32, 8, 32, 4096, 128), (16, 32, 8, 32, 32768, 128),
              (64, 32, 8, 32, 4096, 128), (16, 64, 8, 16, 32768, 128),
              (1, 32, 8, 16, 32768, 128), (16, 32, 8, 16, 4096, 128), (16, 32, 8, 16, 32768, 128),
              (64, 32, 8, 16, 4096, 128),
              (16, 32, 8, 32, 32768, 64), (1, 32, 8, 32, 32768, 64),
              (16, 32, 8, 32, 16384, 256), (16, 32, 8, 16, 16384, 256)]
    for (B, Hq, Hkv, L, N, D) in shapes:
        q, kc, vc, starts, ends = make(B, Hq, Hkv, L, N, D)
        sh = shape_of(q, kc, False)
        ls = launches(D, (Hq // Hkv) * L)
        fns = {tag: (lambda launch=launch: decode_forward(q, kc, vc, sh, scale=D ** -0.5, key_ends=ends, launch=launch))
               for tag, launch in ls.items()}
        base = fns["committed"]()[0]
        errs = {tag: (f()[0].float() - base.float()).abs().max().item() for tag, f in fns.items()}
        times = {tag: [] for tag in fns}
        for _ in range(3):
            for tag, f in fns.items():
                times[tag].append(triton.testing.do_bench_cudagraph(f, rep=100))
        nbytes = 2 * B * Hkv * N * D * 2
        c = statistics.median(times["committed"])
        line = f"B={B} {Hq}/{Hkv} L={L} N={N} D={D} cols={(Hq//Hkv)*L}"
        for tag, v in times.items():
            ms = statistics.median(v)
            line += f" | {tag} {ms*1e3:.1f} us {nbytes/(ms*1e-3)/peak*100:.1f}% x{ms/c:.3f} (diff {errs[tag]:.1e})"
        print(line, flush=True)
