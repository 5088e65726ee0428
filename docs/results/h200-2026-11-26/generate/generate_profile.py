"""Where the host time of generate() with a DynamicCache goes, ours against an attention
that does no work with our masks (the demo's model, 8 left-padded 2048-token prompts, 128
new tokens): cProfile of one generate() each, and torch.profiler's CPU-side operators."""
import cProfile, pstats, io, time, torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface
from cutile_fmha.assets import fmha_llama_demo as demo
from cutile_fmha.transformers_backend import padding_mask


def no_attention(module, query, key, value, attention_mask, **kwargs):
    return query.transpose(1, 2).contiguous(), None


AttentionInterface.register("none_our_mask", no_attention)
AttentionMaskInterface.register("none_our_mask", padding_mask)
args = demo.parse_args(["--batch", "8", "--new-tokens", "128"])
device, dtype = torch.device("cuda"), torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
ours, _ = demo.build_models(args, device, dtype)
none = AutoModelForCausalLM.from_config(demo.model_config(args), attn_implementation="none_our_mask")
none.load_state_dict(ours.state_dict())
models = {"cutile_fmha": ours, "none_our_mask": none.to(device=device, dtype=dtype)}
tokens = demo.random_tokens(args, device)
padded, mask = demo.left_padded(tokens)
with torch.no_grad():
    for m in models.values():
        m.eval(); demo.configure_generation(m, "dynamic")
        demo.generate(m, padded, mask, args.new_tokens)
    for n, m in models.items():
        torch.cuda.synchronize()
        pr = cProfile.Profile(); t0 = time.perf_counter(); pr.enable()
        demo.generate(m, padded, mask, args.new_tokens)
        torch.cuda.synchronize(); pr.disable()
        print(f"=== {n}: {1e3 * (time.perf_counter() - t0):.1f} ms under cProfile", flush=True)
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(45)
        print(s.getvalue()[-9000:], flush=True)
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue()[-6000:], flush=True)
    for n, m in models.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            demo.generate(m, padded, mask, args.new_tokens)
            torch.cuda.synchronize()
        print(f"=== {n}: torch.profiler, by self CPU time", flush=True)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
