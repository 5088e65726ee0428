"""Host time of one decoding step's mask and attention, as generate() with a DynamicCache
makes them on the Llama demo's model, without the model (8 left-padded sequences of 2048
prompt tokens, 16/4 heads, D=128, bf16, 4 layers, each cache one key longer per step, the
generate()'s 2-D int64 mask one column longer): per step, after a synchronize, the host
time of padding_mask (its check, one look at the device) and the four layers'
attention_forward, for the backend before (cutile_fmha_old: PyTorch operations for the
check and the bounds) and after (the padding-runs kernel: one launch for both), and the
two parts apart; rotating order, 300 steps, medians. Outputs compared first."""
import statistics, time, torch
from cutile_fmha import transformers_backend as new
import cutile_fmha_old.transformers_backend as old

B, HQ, HKV, D, PROMPT, LAYERS = 8, 16, 4, 128, 2048, 4
dev, dt = torch.device("cuda"), torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
g = torch.Generator(device=dev).manual_seed(0)
mask2d = torch.ones(B, PROMPT + 400, dtype=torch.long, device=dev)
for row in range(B):
    mask2d[row, :row * PROMPT // (2 * B)] = 0
caches = [[torch.randn(B, HKV, PROMPT, D, device=dev, dtype=dt, generator=g) for _ in range(2)]
          for _ in range(LAYERS)]
module = torch.nn.Module(); module.is_causal = True


def grow():
    for layer in caches:
        for i in (0, 1):
            layer[i] = torch.cat([layer[i], torch.randn(B, HKV, 1, D, device=dev, dtype=dt,
                                                        generator=g)], 2)


def step(backend, q, length, attend=True):
    mask = backend.padding_mask(B, 1, length, attention_mask=mask2d[:, :length])
    if attend:
        return [backend.attention_forward(module, q, k, v, mask, scaling=D ** -0.5)[0]
                for k, v in caches]


length = PROMPT
grow(); length += 1
q = torch.randn(B, 1, HQ, D, device=dev, dtype=dt, generator=g).transpose(1, 2)
assert all(torch.equal(a, b) for a, b in zip(step(old, q, length), step(new, q, length)))
print("before and after: the same outputs", flush=True)
steps = {"mask + attention, before": lambda q, n: step(old, q, n),
         "mask + attention, after": lambda q, n: step(new, q, n),
         "mask alone, before": lambda q, n: step(old, q, n, False),
         "mask alone, after": lambda q, n: step(new, q, n, False)}
times = {n: [] for n in steps}
names = list(steps)
for i in range(320):
    grow(); length += 1
    q = torch.randn(B, 1, HQ, D, device=dev, dtype=dt, generator=g).transpose(1, 2)
    for n in names[i % len(names):] + names[:i % len(names)]:
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        steps[n](q, length)
        t1 = time.perf_counter_ns()
        if i >= 20:
            times[n].append((t1 - t0) / 1e3)
torch.cuda.synchronize()
print(f"host time per decoding step, us, median of {len(times[names[0]])} steps "
      f"(10th-90th percentile):")
for n in names:
    t = sorted(times[n])
    print(f"  {n:28s} {statistics.median(t):7.1f} ({t[len(t) // 10]:.1f}-{t[len(t) * 9 // 10]:.1f})",
          flush=True)
