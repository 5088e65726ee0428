"""What attention_with_kvcache and attention_varlen do with a cache that holds no keys."""
import traceback
import torch
from cutile_fmha import attention_with_kvcache, attention_varlen

dev = "cuda"
def run(name, fn):
    try:
        out = fn()
        torch.cuda.synchronize()
        outs = out if isinstance(out, tuple) else (out,)
        print(name, "OK", [(tuple(o.shape), o.dtype, float(o.float().nan_to_num(123.0).abs().max()) if o.numel() else None,
                            bool(torch.isnan(o).any()) if o.numel() else None) for o in outs])
    except Exception as e:
        print(name, "RAISED", type(e).__name__, str(e)[:300])
        traceback.print_exc(limit=2)
        torch.cuda.synchronize()

for D in (128, 96):
    q = torch.randn(2, 8, 1, D, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(2, 2, 0, D, device=dev, dtype=torch.bfloat16)
    lens = torch.zeros(2, dtype=torch.int32, device=dev)
    run(f"dense D={D} capacity 0, no seqlens", lambda: attention_with_kvcache(q, kc, kc, return_lse=True))
    run(f"dense D={D} capacity 0, seqlens 0", lambda: attention_with_kvcache(q, kc, kc, lens, return_lse=True))
    sinks = torch.randn(8, device=dev)
    run(f"dense D={D} capacity 0, sinks", lambda: attention_with_kvcache(q, kc, kc, lens, return_lse=True, sinks=sinks))
q = torch.randn(2, 8, 1, 128, device=dev, dtype=torch.bfloat16)
pc = torch.randn(4, 16, 2, 128, device=dev, dtype=torch.bfloat16)
table = torch.zeros(2, 0, dtype=torch.int32, device=dev)
lens = torch.zeros(2, dtype=torch.int32, device=dev)
run("paged, block_table with no columns", lambda: attention_with_kvcache(q, pc, pc, lens, block_table=table, return_lse=True))
pc0 = torch.randn(0, 16, 2, 128, device=dev, dtype=torch.bfloat16)
table1 = torch.zeros(2, 1, dtype=torch.int32, device=dev)
run("paged, no blocks in the cache", lambda: attention_with_kvcache(q, pc0, pc0, lens, block_table=table1, return_lse=True))
# q_len 4 causal, capacity 0
q4 = torch.randn(2, 8, 4, 128, device=dev, dtype=torch.bfloat16)
kc = torch.randn(2, 2, 0, 128, device=dev, dtype=torch.bfloat16)
run("dense q_len 4 capacity 0", lambda: attention_with_kvcache(q4, kc, kc, lens, return_lse=True))
# varlen: zero keys
qv = torch.randn(5, 8, 128, device=dev, dtype=torch.bfloat16)
kv = torch.randn(0, 2, 128, device=dev, dtype=torch.bfloat16)
cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device=dev)
cu_k = torch.zeros(3, dtype=torch.int32, device=dev)
run("varlen no keys", lambda: attention_varlen(qv, kv, kv, cu_q, cu_k, 3, 0, return_lse=True))
