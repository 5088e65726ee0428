"""generate() with a DynamicCache (argv[1] "static": a StaticCache, the step in CUDA graphs; no
no-attention model then) on the Llama demo's model (4 layers, hidden 2048, 16/4
heads, D=128, bf16, 8 left-padded 2048-token prompts, 128 new tokens): the backend before
(cutile_fmha_old, main at 9ceea6f) and after (a padding mask's check and key bounds in one
cuTile launch, kernels/padding.py) beside SDPA and
an attention that does no work (our masks): 15 rotating rounds of whole generate() calls;
the medians, and the median over rounds of each round's ratio."""
import statistics, sys, torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface
from cutile_fmha.assets import fmha_llama_demo as demo
from cutile_fmha.transformers_backend import padding_mask
import cutile_fmha_old.transformers_backend as old_backend


def no_attention(module, query, key, value, attention_mask, **kwargs):
    return query.transpose(1, 2).contiguous(), None


AttentionInterface.register("none_our_mask", no_attention)
AttentionMaskInterface.register("none_our_mask", padding_mask)
args = demo.parse_args(["--batch", "8", "--new-tokens", "128"])
device, dtype = torch.device("cuda"), torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
ours, sdpa = demo.build_models(args, device, dtype)
cache = sys.argv[1] if len(sys.argv) > 1 else "dynamic"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
models = {"before": None, "after": ours, "sdpa": sdpa}
if cache == "dynamic":
    models["none_our_mask"] = None
for name, impl in [(n, i) for n, i in (("before", old_backend.register("cutile_old")),
                                       ("none_our_mask", "none_our_mask")) if n in models]:
    m = AutoModelForCausalLM.from_config(demo.model_config(args), attn_implementation=impl)
    m.load_state_dict(ours.state_dict())
    models[name] = m.to(device=device, dtype=dtype)
tokens = demo.random_tokens(args, device)
padded, mask = demo.left_padded(tokens)
with torch.no_grad():
    for m in models.values():
        m.eval(); demo.configure_generation(m, cache)
    out = {n: demo.generate(m, padded, mask, args.new_tokens) for n, m in models.items()}
    assert torch.equal(out["before"].sequences, out["after"].sequences)
    print("before and after: the same tokens; after against sdpa:",
          demo.compare_generations(out["after"], out["sdpa"], args.seq_len, args.logit_tolerance),
          flush=True)
    seconds = demo.seconds_in_turns(
        {n: lambda m=m: demo.generate(m, padded, mask, args.new_tokens)
         for n, m in models.items()}, device, rounds=rounds)
    print(f"{cache} cache: generate() wall time, ms, median of {rounds} rotating rounds (min-max); sdpa's time over it:")
    for n, s in seconds.items():
        print(f"  {n:14s} {statistics.median(s) * 1e3:7.1f} ({min(s) * 1e3:.1f}-{max(s) * 1e3:.1f})"
              f"  {statistics.median(seconds['sdpa']) / statistics.median(s):.3f}x", flush=True)
    for a, b in [(a, b) for a, b in (("before", "after"), ("sdpa", "after"), ("sdpa", "before"),
                                     ("sdpa", "none_our_mask")) if b in seconds]:
        ratios = [x / y for x, y in zip(seconds[a], seconds[b])]
        print(f"  per round, {a}'s time over {b}'s: median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})", flush=True)
