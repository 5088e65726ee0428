"""Why ours varies under a StaticCache compiled into CUDA graphs: per-round generate() time
of each model alone, with dynamo's and inductor's counters after each round."""
import time, sys, torch
from torch._dynamo.utils import counters
from cutile_fmha.assets import fmha_llama_demo as demo

which = sys.argv[1]
args = demo.parse_args(["--batch", "8", "--new-tokens", "128", "--cache", "static"])
ours, sdpa = demo.build_models(args, "cuda", torch.bfloat16)
model = ours if which == "ours" else sdpa
del ours, sdpa
tokens = demo.random_tokens(args, "cuda")
padded, mask = demo.left_padded(tokens)
demo.configure_generation(model.eval(), "static")
with torch.no_grad():
    for r in range(6):
        torch.cuda.synchronize(); t = time.perf_counter()
        demo.generate(model, padded, mask, args.new_tokens)
        torch.cuda.synchronize()
        print(f"{which} round {r}: {(time.perf_counter() - t) * 1e3:.1f} ms; "
              f"unique_graphs {counters['stats']['unique_graphs']}, "
              f"inductor {dict(counters['inductor'])}", flush=True)
