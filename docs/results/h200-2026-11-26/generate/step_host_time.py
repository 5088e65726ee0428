"""Host time of one decoding step's attention, as generate() with a DynamicCache makes it on
the Llama demo's model, without the model: 8 left-padded sequences of 2048 prompt tokens,
16/4 heads, D=128, bf16, 4 layers, each layer's cache one key longer per step (torch.cat,
as DynamicCache does), the query a transposed view (as the model's projection gives it),
the mask made once per step by padding_mask. Per step, after a synchronize, the host time
of the four layers' calls of: an attention that does no work (query.transpose(1, 2)
.contiguous()), transformers_backend.attention_forward before (cutile_fmha_old, cb7ddca)
and after (split buffers as KeptArrays; a growing cache's lengths share a decode plan; the
step's key bounds alone, in 5 small kernels instead of 12), and the after's two parts
apart (key_bounds_of_padding of the step's mask; attention_with_kvcache with those
bounds), in a rotating order over 300 steps; medians per step. step-host-time.log is an
earlier run of this script, on the code before the key bounds stood alone: no "before"
column, and bounds_of_padding (7 kernels) in place of key_bounds_of_padding."""
import statistics, time, torch
from cutile_fmha import transformers_backend as tb
from cutile_fmha import attention_with_kvcache
import cutile_fmha_old.transformers_backend as old_tb

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


def query():
    return torch.randn(B, 1, HQ, D, device=dev, dtype=dt, generator=g).transpose(1, 2)


def none_step(q, mask):
    for k, v in caches:
        q.transpose(1, 2).contiguous()


def ours_step(q, mask):
    for k, v in caches:
        tb.attention_forward(module, q, k, v, mask, scaling=D ** -0.5)


def old_step(q, mask):
    for k, v in caches:
        old_tb.attention_forward(module, q, k, v, mask, scaling=D ** -0.5)


def bounds_step(q, mask):
    tb.key_bounds_of_padding(mask)


def kvcache_step(q, mask):
    starts, ends = tb.key_bounds_of_padding(mask)
    for k, v in caches:
        attention_with_kvcache(q, k, v, ends, cache_leftpad=starts, is_causal=False,
                               scale=D ** -0.5)


steps = {"no attention": none_step, "attention_forward before": old_step,
         "attention_forward after": ours_step,
         "key_bounds_of_padding (once per step)": bounds_step,
         "attention_with_kvcache (bounds made before)": kvcache_step}
times = {n: [] for n in steps}
names = list(steps)
length = PROMPT
for i in range(300 + 20):
    grow(); length += 1
    q = query()
    for n in names[i % len(names):] + names[:i % len(names)]:
        backend = old_tb if n.endswith("before") else tb
        mask = backend.padding_mask(B, 1, length, attention_mask=mask2d[:, :length])
        if n.startswith("attention_with_kvcache"):
            tb.key_bounds_of_padding(mask)  # made before, as the first layer does
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        steps[n](q, mask)
        t1 = time.perf_counter_ns()
        if i >= 20:
            times[n].append((t1 - t0) / 1e3)
    if i == 150:
        print("  (half way)", flush=True)
torch.cuda.synchronize()
print(f"host time per decoding step (4 layers), us, median of {len(times[names[0]])} steps "
      f"(10th-90th percentile):")
for n in names:
    t = sorted(times[n])
    print(f"  {n:45s} {statistics.median(t):7.1f} ({t[len(t) // 10]:.1f}-{t[len(t) * 9 // 10]:.1f})",
          flush=True)
