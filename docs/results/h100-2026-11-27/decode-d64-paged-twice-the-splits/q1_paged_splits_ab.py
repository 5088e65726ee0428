"""One new token, D=128, paged in blocks of 16 (and dense for reference): the rule's splits
against twice and half as many (below min_keys_per_split too), batch 1-4; one process, 5
rotating rounds of CUDA-graph replays, bf16, full lengths."""
import dataclasses, statistics
import torch, triton
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
from cutile_fmha import attention_with_kvcache
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(name, flush=True)
torch.manual_seed(0)
D, Hq, Hkv, L, block = 128, 32, 8, 1, 16
base = entry_for("sm_90").decode[D]
for (B, N) in [(1, 1024), (1, 4096), (1, 32768), (4, 4096), (4, 1024)]:
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
    per = N // block
    kc = torch.randn(B * per, block, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(B * per, device="cuda").int().reshape(B, per)
    dense = [c[table.long()].flatten(1, 2).transpose(1, 2).contiguous() for c in (kc, vc)]
    lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
    shape = DecodeShape(batch=B, head_dim=D, kv_heads=Hkv, group=Hq // Hkv, q_len=L, capacity=N,
                        block_size=block, causal=True, has_starts=False, has_lengths=True,
                        write_lse=False, num_splits=None)
    splits = base.splits(B * Hkv, N, sms)
    fns = {}
    for s in sorted({max(1, splits // 2), splits, min(2 * splits, N // 64)}):
        fns[f"{s} splits"] = (lambda sh=dataclasses.replace(shape, num_splits=s): decode_forward(
            q, kc, vc, sh, scale=D ** -0.5, key_ends=lengths, block_table=table)[0])
    fns["dense (rule)"] = lambda: attention_with_kvcache(q, *dense, lengths)
    outs = {k: f().float() for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(5):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
    med = {k: statistics.median(v) for k, v in times.items()}
    rule = med[f"{splits} splits"]
    print(f"B={B} keys={N} (rule {splits} splits): " + ", ".join(
        f"{k} {v*1e3:.2f} us (x{v/rule:.3f} rule, x{v/med['dense (rule)']:.3f} dense)" for k, v in med.items())
        + f"; max diff {max((o - outs['dense (rule)']).abs().max().item() for o in outs.values()):.1e}", flush=True)
    del kc, vc, dense
    torch.cuda.empty_cache()
