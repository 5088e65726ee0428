"""What any attention kernel can give generate() with a DynamicCache at the Llama demo's
shape (4 layers, hidden 2048, 16/4 heads, D=128, bf16, 8 left-padded 2048-token prompts,
128 new tokens): the demo's two models beside two whose attention does no work (it returns
its query, the only cost being the output's copy that SDPA's path also makes), one with
SDPA's masks and one with this backend's. Rotating rounds of whole generate() calls, then
one profiled generate() per model: the GPU's kernel time against the wall time."""
import statistics, sys, time
import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from cutile_fmha.assets import fmha_llama_demo as demo
from cutile_fmha.transformers_backend import padding_mask


def no_attention(module, query, key, value, attention_mask, **kwargs):
    return query.transpose(1, 2).contiguous(), None


AttentionInterface.register("none_sdpa_mask", no_attention)
AttentionMaskInterface.register("none_sdpa_mask", sdpa_mask)
AttentionInterface.register("none_our_mask", no_attention)
AttentionMaskInterface.register("none_our_mask", padding_mask)

args = demo.parse_args(["--batch", "8", "--new-tokens", "128"])
device, dtype = torch.device("cuda"), torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
ours, sdpa = demo.build_models(args, device, dtype)
models = {"cutile_fmha": ours, "sdpa": sdpa}
for name in ("none_sdpa_mask", "none_our_mask"):
    m = AutoModelForCausalLM.from_config(demo.model_config(args), attn_implementation=name)
    m.load_state_dict(ours.state_dict())
    models[name] = m.to(device=device, dtype=dtype)
tokens = demo.random_tokens(args, device)
padded, mask = demo.left_padded(tokens)
with torch.no_grad():
    for m in models.values():
        m.eval()
        demo.configure_generation(m, "dynamic")
    out = {n: demo.generate(m, padded, mask, args.new_tokens) for n, m in models.items()}
    for n, o in out.items():
        print(f"{n}: {o.sequences.shape[1] - args.seq_len} new tokens", flush=True)
    seconds = demo.seconds_in_turns(
        {n: lambda m=m: demo.generate(m, padded, mask, args.new_tokens)
         for n, m in models.items()}, device, rounds=7)
    print("generate() wall time, ms, median of 7 rotating rounds (min-max); sdpa's time over it:")
    for n, s in seconds.items():
        print(f"  {n:16s} {statistics.median(s) * 1e3:7.1f} ({min(s) * 1e3:.1f}-{max(s) * 1e3:.1f})"
              f"  {statistics.median(seconds['sdpa']) / statistics.median(s):.3f}x", flush=True)
    # the prefill alone, to take out of the decoding steps
    prefill = demo.seconds_in_turns(
        {n: lambda m=m: m(padded, attention_mask=mask) for n, m in models.items()}, device,
        rounds=7)
    print("prefill (the same left-padded batch, no cache), ms:")
    for n, s in prefill.items():
        print(f"  {n:16s} {statistics.median(s) * 1e3:7.2f}", flush=True)
    for n, m in models.items():
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            demo.generate(m, padded, mask, args.new_tokens)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        gpu_us = sum(e.time_range.elapsed_us() for e in kernels)
        attn = sum(e.time_range.elapsed_us() for e in kernels
                   if any(k in e.name for k in ("decode", "merge", "fmha", "attention", "flash",
                                                "cudnn", "varlen", "sm90")))
        print(f"profiled {n}: wall {wall * 1e3:.1f} ms (under the profiler), kernels "
              f"{len(kernels)}, GPU kernel time {gpu_us / 1e3:.1f} ms, of it attention-like "
              f"kernels {attn / 1e3:.1f} ms", flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12),
              flush=True)
