"""Host time per call without CUDA graphs, in one process, paired: the package before
(cutile_fmha_old, cb7ddca: the decode plan's split buffers passed to ct.launch as torch
tensors, converted through DLPack at each launch) and after (as KeptArrays, CUDA array
interfaces made once), called alternately, the order swapped every pair, 20000 pairs after
warm-up; medians of each and of the paired difference (old - new). attention_varlen(),
whose code did not change, is the control. SDPA and attention() timed alone as
references. Outputs compared bit for bit first."""
import statistics, time, torch, torch.nn.functional as F
import cutile_fmha as new
import cutile_fmha_old as old

PAIRS = 20000
clock = time.perf_counter_ns


def alone_us(fn, n=PAIRS):
    times = []
    for i in range(n):
        if i % 100 == 0:
            torch.cuda.synchronize()
        t = clock(); fn(); times.append(clock() - t)
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def paired_us(f_old, f_new, n=PAIRS):
    olds, news, diffs = [], [], []
    for i in range(n):
        if i % 100 == 0:
            torch.cuda.synchronize()
        first, second = (f_old, f_new) if i % 2 else (f_new, f_old)
        t0 = clock(); first(); t1 = clock(); second(); t2 = clock()
        a, b = (t1 - t0, t2 - t1) if i % 2 else (t2 - t1, t1 - t0)  # (old, new)
        olds.append(a); news.append(b); diffs.append(a - b)
    torch.cuda.synchronize()
    return tuple(statistics.median(x) / 1e3 for x in (olds, news, diffs))


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
    mods = {"old": old, "new": new}
    calls = {m: {"attention_varlen()": lambda mod=mod: mod.attention_varlen(
                     qp, kp, vp, cq, ck, q_len, 512, is_causal=True),
                 "attention_varlen(return_lse=True)": lambda mod=mod: mod.attention_varlen(
                     qp, kp, vp, cq, ck, q_len, 512, is_causal=True, return_lse=True)[0]}
             for m, mod in mods.items()}
    if q_len <= 16:
        for m, mod in mods.items():
            calls[m]["attention_with_kvcache()"] = lambda mod=mod: mod.attention_with_kvcache(
                q, kc, vc, lengths)
            calls[m]["attention_with_kvcache(num_splits=1)"] = \
                lambda mod=mod: mod.attention_with_kvcache(q, kc, vc, lengths, num_splits=1)
    for name in calls["old"]:
        assert torch.equal(calls["old"][name](), calls["new"][name]()), (q_len, name)
    sdpa = lambda: F.scaled_dot_product_attention(q, kc, vc, is_causal=q_len > 1, enable_gqa=True)
    ours = lambda: new.attention(q, kc, vc, is_causal=q_len > 1, enable_gqa=True)
    for f in (sdpa, ours, *calls["old"].values(), *calls["new"].values()):
        for _ in range(500):
            f()
    print(f"q_len {q_len}, B=1, 32/8 heads, D=128, 512 keys, bf16; us per call, median of "
          f"{PAIRS}:", flush=True)
    print(f"  SDPA {alone_us(sdpa):.1f}, attention() {alone_us(ours):.1f}", flush=True)
    for name in calls["old"]:
        o, n, d = paired_us(calls["old"][name], calls["new"][name])
        print(f"  {name:40s} old {o:5.1f}  new {n:5.1f}  paired difference {d:+.2f}", flush=True)
    print(f"  again alone: SDPA {alone_us(sdpa):.1f}, attention() {alone_us(ours):.1f}", flush=True)
