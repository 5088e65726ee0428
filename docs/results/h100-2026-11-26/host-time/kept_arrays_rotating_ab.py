"""Host time per call without CUDA graphs, every call of one shape timed in the same loop:
each iteration runs SDPA, attention() and the entry points of the package before
(cutile_fmha_old, cb7ddca: the split buffers passed to ct.launch as torch tensors) and
after (as KeptArrays, CUDA array interfaces made once) once each, in an order rotated every
iteration, so that all of them see the same stretch of the host's noise; 20000 iterations
after warm-up, medians. Outputs compared bit for bit first."""
import statistics, time, torch, torch.nn.functional as F
import cutile_fmha as new
import cutile_fmha_old as old

ITERATIONS = 20000
clock = time.perf_counter_ns
dev, dt = "cuda", torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for q_len in (1, 4):
    g = torch.Generator(device=dev).manual_seed(q_len)
    q = torch.randn(1, 32, q_len, 128, device=dev, dtype=dt, generator=g)
    kc = torch.randn(1, 8, 512, 128, device=dev, dtype=dt, generator=g); vc = torch.randn_like(kc)
    qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, kc, vc))
    cq = torch.tensor([0, q_len], dtype=torch.int32, device=dev)
    ck = torch.tensor([0, 512], dtype=torch.int32, device=dev)
    lengths = torch.tensor([512], dtype=torch.int32, device=dev)
    calls = {"SDPA": lambda: F.scaled_dot_product_attention(q, kc, vc, is_causal=q_len > 1,
                                                            enable_gqa=True),
             "attention()": lambda: new.attention(q, kc, vc, is_causal=q_len > 1, enable_gqa=True)}
    for tag, mod in (("old", old), ("new", new)):
        calls[f"attention_varlen() {tag}"] = lambda mod=mod: mod.attention_varlen(
            qp, kp, vp, cq, ck, q_len, 512, is_causal=True)
        if q_len <= 16:
            calls[f"attention_with_kvcache() {tag}"] = lambda mod=mod: mod.attention_with_kvcache(
                q, kc, vc, lengths)
            calls[f"attention_with_kvcache(num_splits=1) {tag}"] = \
                lambda mod=mod: mod.attention_with_kvcache(q, kc, vc, lengths, num_splits=1)
    for name in [n for n in calls if n.endswith(" old")]:
        assert torch.equal(calls[name](), calls[name[:-3] + "new"]()), (q_len, name)
    for f in calls.values():
        for _ in range(500):
            f()
    names = list(calls)
    times = {name: [] for name in names}
    for i in range(ITERATIONS):
        if i % 50 == 0:
            torch.cuda.synchronize()
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            t = clock(); calls[name](); times[name].append(clock() - t)
    torch.cuda.synchronize()
    print(f"q_len {q_len}, B=1, 32/8 heads, D=128, 512 keys, bf16; us per call, median of "
          f"{ITERATIONS} (10th-90th percentile):", flush=True)
    for name in names:
        ts = sorted(times[name])
        print(f"  {name:44s} {statistics.median(ts) / 1e3:5.1f} "
              f"({ts[len(ts) // 10] / 1e3:.1f}-{ts[len(ts) * 9 // 10] / 1e3:.1f})", flush=True)
    for name in [n for n in names if n.endswith(" old")]:
        diffs = [a - b for a, b in zip(times[name], times[name[:-3] + "new"])]
        print(f"  {name[:-4]}: old - new, median of the per-iteration differences "
              f"{statistics.median(diffs) / 1e3:+.2f}", flush=True)
