"""A small Llama through transformers with cuTile FMHA, next to the same model with SDPA.

    pip install -e ".[transformers]"
    python assets/fmha_llama_demo.py

Builds a Llama-architecture model from a config with random weights (nothing is
downloaded), registers cuTile FMHA as ``attn_implementation="cutile_fmha"``, and:
1. prefill: the same tokens through both models; the largest logit difference and each
   model's prefill time;
2. training: a few AdamW steps through each model on one batch (the loss must go down
   through ours), and each model's training tokens per second.
Exits non-zero when the logits differ by more than --logit-tolerance (relative to the
largest logit) or the loss does not go down.
"""

import argparse
import copy
import statistics
import sys
import time

import torch

from cutile_fmha.assets import measure

SDPA = "sdpa"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=measure.positive_int, default=4)
    parser.add_argument("--hidden-size", type=measure.positive_int, default=2048)
    parser.add_argument("--heads", type=measure.positive_int, default=16)
    parser.add_argument("--kv-heads", type=measure.positive_int, default=4)
    parser.add_argument("--vocab-size", type=measure.positive_int, default=32000)
    parser.add_argument("--batch", type=measure.positive_int, default=4)
    parser.add_argument("--seq-len", type=measure.positive_int, default=2048)
    parser.add_argument("--train-steps", type=measure.positive_int, default=8)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(measure.DTYPES))
    parser.add_argument("--logit-tolerance", type=float, default=2e-2,
                        help="largest |logit difference| allowed, over the largest |logit|")
    args = parser.parse_args(argv)
    if args.hidden_size % args.heads or args.heads % args.kv_heads:
        parser.error("--heads must divide --hidden-size, and --kv-heads --heads")
    if args.train_steps < 2:
        parser.error("--train-steps must be at least 2: one warm-up step, then timed ones")
    return args


def build_models(args, device, dtype):
    """(ours, sdpa): one random Llama, the same weights, two attention implementations."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from cutile_fmha.transformers_backend import register

    def model(attn_implementation):
        # a config each: from_config records the implementation in the config it is given
        config = LlamaConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                             intermediate_size=4 * args.hidden_size,
                             num_hidden_layers=args.layers, num_attention_heads=args.heads,
                             num_key_value_heads=args.kv_heads,
                             max_position_embeddings=max(args.seq_len, 128))
        built = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
        return built.to(device=device, dtype=dtype)

    torch.manual_seed(0)
    ours, sdpa = model(register()), model(SDPA)
    sdpa.load_state_dict(ours.state_dict())
    return ours, sdpa


def seconds(fn, device, repeats: int = 3) -> float:
    """Median wall seconds of `fn()`, after one warm-up call."""
    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def train(model, tokens, steps: int, device) -> tuple[list[float], float]:
    """(loss per step, tokens per second) of `steps` AdamW steps on one batch."""
    model = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []

    def step():
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())

    step_seconds = seconds(step, device, repeats=steps - 1)  # the first step warms up
    return losses, tokens.numel() / step_seconds


def run(args, device, dtype: torch.dtype | None = None) -> dict:
    """The demo's numbers; `dtype` overrides --dtype (the tests run float32 on the CPU)."""
    dtype = dtype or measure.DTYPES[args.dtype]
    ours, sdpa = build_models(args, device, dtype)
    generator = torch.Generator(device=device).manual_seed(1)
    tokens = torch.randint(0, args.vocab_size, (args.batch, args.seq_len), device=device,
                           generator=generator)
    with torch.no_grad():
        logits = {name: model.eval()(tokens).logits.float()
                  for name, model in (("cutile_fmha", ours), (SDPA, sdpa))}
        prefill = {name: seconds(lambda model=model: model(tokens), device)
                   for name, model in (("cutile_fmha", ours), (SDPA, sdpa))}
    difference = (logits["cutile_fmha"] - logits[SDPA]).abs().max().item()
    largest = logits[SDPA].abs().max().item()
    training = {name: train(model, tokens, args.train_steps, device)
                for name, model in (("cutile_fmha", ours), (SDPA, sdpa))}
    return {"max_logit_difference": difference, "largest_logit": largest,
            "prefill_seconds": prefill,
            "losses": {name: losses for name, (losses, _) in training.items()},
            "train_tokens_per_second": {name: rate for name, (_, rate) in training.items()}}


def report(result: dict, args) -> tuple[str, bool]:
    relative = result["max_logit_difference"] / result["largest_logit"]
    losses = result["losses"]["cutile_fmha"]
    ok = relative <= args.logit_tolerance and losses[-1] < losses[0]
    lines = [
        f"Llama: {args.layers} layers, hidden {args.hidden_size}, {args.heads} heads "
        f"({args.kv_heads} K/V), D={args.hidden_size // args.heads}, batch {args.batch} x "
        f"{args.seq_len} tokens, {args.dtype}",
        f"prefill: largest logit difference {result['max_logit_difference']:.3e} "
        f"({relative:.2e} of the largest logit; tolerance {args.logit_tolerance:.0e})",
    ]
    lines += [f"  {name}: prefill {seconds_ * 1e3:.1f} ms"
              for name, seconds_ in result["prefill_seconds"].items()]
    lines.append("training, loss per step (cutile_fmha): "
                 + " ".join(f"{loss:.3f}" for loss in losses))
    lines += [f"  {name}: {rate:,.0f} tokens/s"
              for name, rate in result["train_tokens_per_second"].items()]
    lines.append("OK" if ok else "FAILED: logits differ beyond the tolerance, or the loss "
                                 "did not go down")
    return "\n".join(lines), ok


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The demo needs")):
        print(problem, file=sys.stderr)
        return 1
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("The demo needs transformers: pip install -e '.[transformers]'", file=sys.stderr)
        return 1
    text, ok = report(run(args, torch.device("cuda")), args)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
