"""The Llama demo's model (B=4 x 2048, bf16) with three attention implementations, the
same weights: SDPA, the backend before (cutile_fmha_old: HEAD's files, which looked for
packed sequences in a 4-row batch's positions, a device read per forward) and after; the
prefill and a training step timed in rotating rounds, and the host syncs per prefill."""
import copy, statistics, sys, time, torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM
from cutile_fmha.assets import fmha_llama_demo as demo
import cutile_fmha.transformers_backend as new_backend
import cutile_fmha_old.transformers_backend as old_backend
args = demo.parse_args([])
device = torch.device("cuda")
torch.manual_seed(0)
names = {"sdpa": "sdpa", "old": old_backend.register("cutile_fmha_old"), "new": new_backend.register()}
models = {k: AutoModelForCausalLM.from_config(demo.model_config(args), attn_implementation=v) for k, v in names.items()}
for m in models.values():
    m.load_state_dict(models["sdpa"].state_dict())
models = {k: m.to(device=device, dtype=torch.bfloat16) for k, m in models.items()}
tokens = demo.random_tokens(args, device)
with torch.no_grad():
    logits = {k: m.eval()(tokens).logits for k, m in models.items()}
    assert torch.equal(logits["old"], logits["new"])
    for k, m in models.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            m(tokens)
        syncs = sum(e.count for e in prof.key_averages() if "Synchronize" in e.key)
        print(f"{k}: host synchronisations in one prefill: {syncs}", flush=True)
    prefill = demo.seconds_in_turns({k: (lambda m=m: m(tokens)) for k, m in models.items()}, device, rounds=15)
for k, v in prefill.items():
    print(f"prefill {k}: {statistics.median(v)*1e3:.2f} ms (rounds {min(v)*1e3:.2f} to {max(v)*1e3:.2f})", flush=True)
train = demo.train(list(models.items()), 16, device, input_ids=tokens)
for k, (losses, tps) in train.items():
    print(f"training {k}: {statistics.median(tps):,.0f} tokens/s (rounds {min(tps):,.0f} to {max(tps):,.0f})", flush=True)
