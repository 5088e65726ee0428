"""A small Llama through transformers with cuTile FMHA, next to the same model with SDPA.

    pip install -e ".[transformers]"
    python assets/fmha_llama_demo.py
    python assets/fmha_llama_demo.py --architecture gemma2    # softcap, sliding windows
    python assets/fmha_llama_demo.py --architecture gpt-oss   # sinks, sliding windows

Builds a Llama-architecture model from a config with random weights (nothing is
downloaded), registers cuTile FMHA as ``attn_implementation="cutile_fmha"``, and:
1. prefill: the same tokens through both models; the largest difference of each model's
   logits from the reference model's in float32 (same weights), and each model's prefill
   time;
2. padded prefill: the batch left-padded (row i by i/(2·batch) of its length), the same
   differences on real tokens and each model's time;
3. training: a few AdamW steps through each model on one batch (the loss must go down
   through ours), and each model's training tokens per second;
4. packed training: the padded batch's real tokens packed in one row with no padding
   (positions restart at each sequence), a few AdamW steps as in 3;
5. generate(): greedy decoding of --new-tokens after the left-padded prompts, each
   model's time and how many tokens agree; where they differ, the first differing token
   must be a near-tie in SDPA's logits (within --logit-tolerance of the best). With
   --cache dynamic (the default), transformers' DynamicCache, run eagerly: the host's
   Python per token bounds it. With --cache static, a StaticCache and the decoding step
   compiled into CUDA graphs (torch.compile, fullgraph, mode="reduce-overhead"), as a
   serving loop runs it: the GPU's time bounds it.
Each time is the median of rounds in which the two models take turns, each round starting
with the other (--rounds for 1, 2 and 5; a training step per round for 3 and 4).
Exits non-zero when our logits differ from the float32 model's by more than
--logit-tolerance (relative to its largest logit), the loss does not go down, or generate()
differs other than at a near-tie.

--architecture gemma2 builds a Gemma-2-like model instead (logit softcap --softcap, a
sliding window of --sliding-window tokens on every other layer), gpt-oss a gpt-oss-like one
(a learnable sink per head, drawn at random, sliding windows on every other layer; two
experts, both used by every token, so that no router near-tie flips a token's experts).
Their reference is transformers' eager attention.

--profile runs none of that: it profiles --train-steps training steps of each model (after
one warm-up step) with torch.profiler and prints, per model, the time per step and the
--profile-top operators and kernels by their own GPU time (CPU time on a CPU), with calls
per step: where a model's step spends its time, attention's kernels and the copies
around them included.
"""

import argparse
import copy
import statistics
import sys
import time

import torch

from cutile_fmha.assets import measure

SDPA = "sdpa"
OURS = "cutile_fmha"
EXACT = "the reference model in float32"
ARCHITECTURES = ("llama", "gemma2", "gpt-oss")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=measure.positive_int, default=4)
    parser.add_argument("--hidden-size", type=measure.positive_int, default=2048)
    parser.add_argument("--heads", type=measure.positive_int, default=16)
    parser.add_argument("--kv-heads", type=measure.positive_int, default=4)
    parser.add_argument("--vocab-size", type=measure.positive_int, default=32000)
    parser.add_argument("--batch", type=measure.positive_int, default=4)
    parser.add_argument("--seq-len", type=measure.positive_int, default=2048)
    parser.add_argument("--train-steps", type=measure.positive_int, default=8,
                        help="AdamW steps per model: one warm-up, then one per round")
    parser.add_argument("--rounds", type=measure.positive_int, default=5,
                        help="rounds of the prefill and generate() timings")
    parser.add_argument("--new-tokens", type=measure.positive_int, default=32,
                        help="tokens generate() adds after the left-padded prompts")
    parser.add_argument("--cache", default="dynamic", choices=("dynamic", "static"),
                        help="generate()'s KV cache: DynamicCache, eager; or StaticCache "
                             "with the decoding step in CUDA graphs (see above)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(measure.DTYPES))
    parser.add_argument("--logit-tolerance", type=float, default=2e-2,
                        help="largest |logit difference| allowed, over the largest |logit|")
    parser.add_argument("--architecture", default="llama", choices=ARCHITECTURES)
    parser.add_argument("--sliding-window", type=measure.positive_int, default=512,
                        help="gemma2 and gpt-oss: the sliding layers' window, in tokens")
    parser.add_argument("--softcap", type=float, default=50.0,
                        help="gemma2: the attention logits' softcap")
    parser.add_argument("--profile", action="store_true",
                        help="instead: profile each model's training step (see above)")
    parser.add_argument("--profile-top", type=measure.positive_int, default=20,
                        help="with --profile: how many operators and kernels to list")
    args = parser.parse_args(argv)
    if args.hidden_size % args.heads or args.heads % args.kv_heads:
        parser.error("--heads must divide --hidden-size, and --kv-heads --heads")
    if args.train_steps < 2:
        parser.error("--train-steps must be at least 2: one warm-up step, then timed ones")
    return args


def reference_of(args) -> str:
    """The attention implementation ours is compared with: SDPA for the Llama, eager for
    the models whose softcap or sinks SDPA does not take."""
    return SDPA if args.architecture == "llama" else "eager"


def model_config(args):
    """A transformers config of --architecture's model at the demo's sizes."""
    from transformers import Gemma2Config, GptOssConfig, LlamaConfig

    common = dict(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                  num_hidden_layers=args.layers, num_attention_heads=args.heads,
                  num_key_value_heads=args.kv_heads,
                  max_position_embeddings=max(args.seq_len + args.new_tokens, 128))
    head_dim = args.hidden_size // args.heads
    if args.architecture == "gemma2":
        return Gemma2Config(**common, intermediate_size=4 * args.hidden_size, head_dim=head_dim,
                            sliding_window=args.sliding_window,
                            attn_logit_softcapping=args.softcap, final_logit_softcapping=None,
                            query_pre_attn_scalar=head_dim)
    if args.architecture == "gpt-oss":
        return GptOssConfig(**common, intermediate_size=args.hidden_size, head_dim=head_dim,
                            num_local_experts=2, num_experts_per_tok=2,
                            sliding_window=args.sliding_window)
    return LlamaConfig(**common, intermediate_size=4 * args.hidden_size)


def build_models(args, device, dtype):
    """(ours, reference): one random model of --architecture, the same weights, two
    attention implementations."""
    from transformers import AutoModelForCausalLM

    from cutile_fmha.transformers_backend import register

    def model(attn_implementation):
        # a config each: from_config records the implementation in the config it is given
        return AutoModelForCausalLM.from_config(model_config(args),
                                                attn_implementation=attn_implementation)

    torch.manual_seed(0)
    ours, reference = model(register()), model(reference_of(args))
    if args.architecture == "gpt-oss":  # sinks start at zero: make them matter
        with torch.no_grad():
            for layer in ours.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    reference.load_state_dict(ours.state_dict())
    return ours.to(device=device, dtype=dtype), reference.to(device=device, dtype=dtype)


def seconds_in_turns(fns: dict, device, rounds: int = 3) -> dict:
    """Wall seconds of each of `fns` (name -> fn) per round, after one warm-up call each:
    timed in rotating rounds (``measure.time_in_rounds``), so that neither model always
    runs first, on a cooler GPU; the report takes the median of the rounds."""
    def wall_seconds(fn) -> float:
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        return time.perf_counter() - start

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for fn in fns.values():
        fn()
    return dict(zip(fns, measure.time_in_rounds(list(fns.values()), rounds, wall_seconds)))


def trainer(model, **batch):
    """(step, losses): one AdamW step on a copy of `model` and the losses it has appended
    to, on one batch (the model's keyword arguments; labels are the input ids, -100 on
    padding)."""
    model = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    mask = batch.get("attention_mask")
    labels = batch["input_ids"] if mask is None else batch["input_ids"].masked_fill(mask == 0, -100)

    def step():
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())

    return step, losses


def train(models, steps: int, device, **batch) -> dict:
    """Per model (name -> model), (loss per step, real tokens per second of each timed
    step) of `steps` AdamW steps on one batch (see ``trainer``): the first step of each
    warms up, then the models take their steps in rotating rounds."""
    trainers = {name: trainer(model, **batch) for name, model in models}
    step_seconds = seconds_in_turns({name: step for name, (step, _) in trainers.items()},
                                    device, rounds=steps - 1)
    mask = batch.get("attention_mask")
    real_tokens = batch["input_ids"].numel() if mask is None else int(mask.sum())
    return {name: (losses, [real_tokens / seconds for seconds in step_seconds[name]])
            for name, (_, losses) in trainers.items()}


def random_tokens(args, device) -> torch.Tensor:
    """The demo's batch: (--batch, --seq-len) token ids, the same on every run."""
    return torch.randint(1, args.vocab_size, (args.batch, args.seq_len), device=device,
                         generator=torch.Generator(device=device).manual_seed(1))


def profile_training(args, device, dtype: torch.dtype | None = None) -> str:
    """--profile's report: per model, its training step's time and the operators and
    kernels that take the most of it (on a CUDA device their own GPU time, else CPU time)."""
    from tabulate import tabulate
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    ours, theirs = build_models(args, device, dtype or measure.DTYPES[args.dtype])
    tokens = random_tokens(args, device)
    lines = [describe_model(args)]
    for name, model in ((OURS, ours), (reference_of(args), theirs)):
        step, _ = trainer(model, input_ids=tokens)
        step()  # warm-up: compilation and the allocator's first blocks
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=activities) as profiler:
            start = time.perf_counter()
            for _ in range(args.train_steps):
                step()
            if on_gpu:
                torch.cuda.synchronize(device)
            wall = (time.perf_counter() - start) / args.train_steps
        own_time = "self_device_time_total" if on_gpu else "self_cpu_time_total"
        events = sorted((e for e in profiler.key_averages() if getattr(e, own_time) > 0),
                        key=lambda e: -getattr(e, own_time))
        rows = [[f"{getattr(e, own_time) / args.train_steps / 1e3:.3f}",
                 f"{e.count / args.train_steps:g}", e.key[:100]]
                for e in events[:args.profile_top]]
        lines += [f"{name}: {wall * 1e3:.2f} ms per training step (wall, under the profiler)",
                  tabulate(rows, headers=[f"{'GPU' if on_gpu else 'CPU'} ms per step",
                                          "calls per step", "operator or kernel"]), ""]
    return "\n".join(lines)


def left_padded(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, attention_mask): row i of `tokens` left-padded by i / (2 · batch) of its
    length (pad id 0), as generate() pads prompts of different lengths."""
    batch, length = tokens.shape
    mask = torch.ones_like(tokens)
    for row in range(batch):
        mask[row, :row * length // (2 * batch)] = 0
    return tokens.masked_fill(mask == 0, 0), mask


def packed(tokens: torch.Tensor, mask: torch.Tensor) -> dict:
    """The real tokens of each row end to end in one row, positions restarting at each
    (transformers' padding-free format)."""
    rows = [row[keep.bool()] for row, keep in zip(tokens, mask)]
    positions = [torch.arange(len(row), device=tokens.device) for row in rows]
    return {"input_ids": torch.cat(rows)[None], "position_ids": torch.cat(positions)[None]}


def configure_generation(model, cache: str) -> None:
    """generate()'s cache for --cache: transformers' default (dynamic), or a StaticCache
    with the decoding step compiled into CUDA graphs (static)."""
    from transformers import CompileConfig

    static = cache == "static"
    model.generation_config.cache_implementation = "static" if static else None
    model.generation_config.compile_config = \
        CompileConfig(fullgraph=True, mode="reduce-overhead") if static else None


def generate(model, tokens, mask, new_tokens: int):
    return model.generate(tokens, attention_mask=mask, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                          return_dict_in_generate=True, output_logits=True)


def compare_generations(ours, sdpa, prompt_len: int, tolerance: float) -> dict:
    """How many new tokens agree; for each row that differs, whether its first differing
    token was a near-tie in SDPA's logits (within `tolerance` of the best, relative to the
    largest logit)."""
    mine, theirs = ours.sequences[:, prompt_len:], sdpa.sequences[:, prompt_len:]
    near_ties = []
    for row in range(mine.shape[0]):
        differing = (mine[row] != theirs[row]).nonzero()
        if len(differing):
            step = int(differing[0])
            logits = sdpa.logits[step][row].float()
            gap = (logits.max() - logits[mine[row, step]]).item()
            near_ties.append(gap <= tolerance * logits.abs().max().item())
    return {"agreeing": int((mine == theirs).sum()), "tokens": mine.numel(),
            "rows_differing": len(near_ties), "all_near_ties": all(near_ties)}


def logit_differences(logits: dict, reference: str, prefix: str = "") -> dict:
    """The largest |logit difference| of ours and of the reference from the reference
    model in float32 (EXACT), and that model's largest |logit|."""
    exact = logits[EXACT]
    return {f"{prefix}{key}": (logits[name] - exact).abs().max().item()
            for key, name in (("logit_difference", OURS),
                              ("reference_logit_difference", reference))} | \
        {f"{prefix}largest_logit": exact.abs().max().item()}


def run(args, device, dtype: torch.dtype | None = None) -> dict:
    """The demo's numbers; `dtype` overrides --dtype (the tests run float32 on the CPU)."""
    dtype = dtype or measure.DTYPES[args.dtype]
    reference = reference_of(args)
    ours, theirs = build_models(args, device, dtype)
    models = ((OURS, ours), (reference, theirs))
    tokens = random_tokens(args, device)
    padded, mask = left_padded(tokens)
    real = mask.bool()
    # The logits' truth: the reference model in float32 (in bfloat16 it has an error of its
    # own, over the tolerance on the gpt-oss-like model).
    exact = () if dtype == torch.float32 else ((EXACT, copy.deepcopy(theirs).float()),)
    with torch.no_grad():
        logits = {name: model.eval()(tokens).logits.float() for name, model in models + exact}
        padded_logits = {name: model(padded, attention_mask=mask).logits.float()[real]
                         for name, model in models + exact}
        del exact
        for found in (logits, padded_logits):
            found.setdefault(EXACT, found[reference])
        prefill = seconds_in_turns({name: lambda model=model: model(tokens)
                                    for name, model in models}, device, args.rounds)
        padded_prefill = seconds_in_turns(
            {name: lambda model=model: model(padded, attention_mask=mask)
             for name, model in models}, device, args.rounds)
        for _, model in models:
            configure_generation(model, args.cache)
        generations = {name: generate(model, padded, mask, args.new_tokens)
                       for name, model in models}
        generate_seconds = seconds_in_turns(
            {name: lambda model=model: generate(model, padded, mask, args.new_tokens)
             for name, model in models}, device, args.rounds)
    result = {
        "reference": reference, "prefill_seconds": prefill,
        **logit_differences(logits, reference), "padded_prefill_seconds": padded_prefill,
        **logit_differences(padded_logits, reference, "padded_"),
        "generate_seconds": generate_seconds,
        "generate": compare_generations(generations[OURS], generations[reference],
                                        args.seq_len, args.logit_tolerance)}
    training = train(models, args.train_steps, device, input_ids=tokens)
    packed_training = train(models, args.train_steps, device, **packed(padded, mask))
    return result | {
        "losses": {name: losses for name, (losses, _) in training.items()},
        "train_tokens_per_second": {name: rate for name, (_, rate) in training.items()},
        "packed_losses": {name: losses for name, (losses, _) in packed_training.items()},
        "packed_tokens_per_second": {name: rate for name, (_, rate) in packed_training.items()}}


def describe_model(args) -> str:
    what = {"llama": "Llama", "gemma2": f"Gemma-2-like (softcap {args.softcap:g}, sliding "
                                        f"window {args.sliding_window} every other layer)",
            "gpt-oss": f"gpt-oss-like (sinks, sliding window {args.sliding_window} every "
                       f"other layer)"}[args.architecture]
    return (f"{what}: {args.layers} layers, hidden {args.hidden_size}, {args.heads} heads "
            f"({args.kv_heads} K/V), D={args.hidden_size // args.heads}, batch {args.batch} x "
            f"{args.seq_len} tokens, {args.dtype}")


def timing_lines(rounds: dict, reference: str, label: str = "", unit: str = "ms") -> list[str]:
    """Each model's median over its rounds (name -> seconds per round, or with a rate
    `unit` the rate per round) and their range, then ours as a multiple of the reference's
    speed (above 1: ours is faster)."""
    def shown(value: float) -> str:
        return f"{value * 1e3:.1f}" if unit == "ms" else f"{value:,.0f}"

    medians = {name: statistics.median(values) for name, values in rounds.items()}
    lines = [f"  {name}: {label}{shown(medians[name])} {unit} (rounds {shown(min(values))}"
             f" to {shown(max(values))})" for name, values in rounds.items()]
    speed = medians[OURS] / medians[reference]
    speed = speed if unit != "ms" else 1 / speed
    return lines + [f"  {OURS} at {speed:.3f}x {reference}'s speed"]


def report(result: dict, args) -> tuple[str, bool]:
    reference = result["reference"]
    generated = result["generate"]
    checks = {}

    def logits_line(prefix: str = "") -> tuple[str, bool]:
        """The prefill's (with prefix "padded_", the padded prefill's) logits line, and
        whether ours lie within --logit-tolerance of the float32 model's logits."""
        largest = result[f"{prefix}largest_logit"]
        ours, theirs = (result[f"{prefix}{key}"] for key in
                        ("logit_difference", "reference_logit_difference"))
        return (f"largest logit difference from {reference}'s model in float32: {OURS} "
                f"{ours:.3e} ({ours / largest:.2e} of the largest logit; tolerance "
                f"{args.logit_tolerance:.0e}), {reference} in {args.dtype} {theirs:.3e} "
                f"({theirs / largest:.2e})"), ours / largest <= args.logit_tolerance

    line, checks["prefill logits"] = logits_line()
    lines = [describe_model(args), f"prefill: {line}"]
    lines += timing_lines(result["prefill_seconds"], reference, "prefill ")
    line, checks["padded prefill logits"] = logits_line("padded_")
    lines.append(f"padded prefill (left padding), on real tokens: {line}")
    lines += timing_lines(result["padded_prefill_seconds"], reference, "padded prefill ")
    checks["generate() tokens"] = generated["all_near_ties"]
    losses, packed_losses = result["losses"][OURS], result["packed_losses"][OURS]
    checks |= {"training loss": losses[-1] < losses[0],
               "packed training loss": packed_losses[-1] < packed_losses[0]}
    lines.append(f"training, loss per step ({OURS}): "
                 + " ".join(f"{loss:.3f}" for loss in losses))
    lines += timing_lines(result["train_tokens_per_second"], reference, unit="tokens/s")
    lines.append(f"packed training (no padding), loss per step ({OURS}): "
                 + " ".join(f"{loss:.3f}" for loss in packed_losses)
                 + f"; {reference}'s first loss {result['packed_losses'][reference][0]:.3f}")
    lines += timing_lines(result["packed_tokens_per_second"], reference,
                          unit="real tokens/s")
    lines.append(f"generate() of {args.new_tokens} tokens after the left-padded prompts "
                 f"({args.cache} cache): "
                 f"{generated['agreeing']}/{generated['tokens']} tokens agree with "
                 f"{reference}'s"
                 + (f"; {generated['rows_differing']} rows differ, from "
                    + ("a near-tie each" if generated["all_near_ties"] else "NOT only near-ties")
                    if generated["rows_differing"] else ""))
    lines += timing_lines(result["generate_seconds"], reference)
    failed = [name for name, ok in checks.items() if not ok]
    lines.append("OK" if not failed else f"FAILED: {', '.join(failed)}")
    return "\n".join(lines), not failed


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
    if args.profile:
        print(profile_training(args, torch.device("cuda")))
        return 0
    text, ok = report(run(args, torch.device("cuda")), args)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
