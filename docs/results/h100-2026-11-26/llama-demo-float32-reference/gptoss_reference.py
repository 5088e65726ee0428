"""The demo's gpt-oss-like (and Gemma-2-like) model: logits of ours (bf16) and eager (bf16)
against eager in float32 on the same weights, on the demo's prompt (B=4 x 2048)."""
import copy, sys, torch
sys.argv = [sys.argv[0]] + sys.argv[1:]
from cutile_fmha.assets import fmha_llama_demo as demo

for arch in ("gpt-oss", "gemma2"):
    args = demo.parse_args(["--architecture", arch])
    device = torch.device("cuda")
    ours, eager = demo.build_models(args, device, torch.bfloat16)
    ref = copy.deepcopy(eager).float()
    tokens = demo.random_tokens(args, device)
    padded, mask = demo.left_padded(tokens)
    real = mask.bool()
    with torch.no_grad():
        for label, kw, sel in (("prefill", dict(input_ids=tokens), None),
                               ("padded", dict(input_ids=padded, attention_mask=mask), real)):
            out = {}
            for name, m in (("ours bf16", ours), ("eager bf16", eager), ("eager fp32", ref)):
                lg = m.eval()(**kw).logits.float()
                out[name] = lg[sel] if sel is not None else lg
            r = out["eager fp32"]; big = r.abs().max().item()
            for name in ("ours bf16", "eager bf16"):
                d = (out[name] - r).abs()
                print(f"{arch} {label}: {name} vs eager fp32: max {d.max().item():.3e} ({d.max().item()/big:.2e} of largest), "
                      f"rms {d.pow(2).mean().sqrt().item():.3e}")
            d = (out["ours bf16"] - out["eager bf16"]).abs().max().item()
            print(f"{arch} {label}: ours vs eager bf16: {d:.3e} ({d/big:.2e})")
