"""The transformers backend on the GPU with the real kernels: padded batches (left and
right padding, DynamicCache and StaticCache generate()), and packed training batches,
against SDPA and against each other. The CPU twins of these tests
(test_transformers_backend.py) run the same wiring with the kernels replaced by float64."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from cutile_fmha import transformers_backend as backend  # noqa: E402
from cutile_fmha.assets.fmha_llama_demo import compare_generations, generate  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TOLERANCE = 2e-2  # of the largest logit, as the Llama demo's


def llama(attn_implementation, dtype=torch.bfloat16, head_dim=128):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, head_dim=head_dim)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.to(device="cuda", dtype=dtype).eval()


@pytest.fixture(scope="module")
def models():
    return llama(backend.register()), llama("sdpa")


def padded_batch(side: str):
    tokens = torch.randint(1, 512, (4, 300), device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(2))
    mask = torch.ones_like(tokens)
    for row, pad in enumerate((0, 17, 150, 299)):
        mask[row, slice(None, pad) if side == "left" else slice(300 - pad, None)] = 0
    return tokens.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_prefill_gives_sdpas_logits_on_real_tokens(side, models, kernel_calls):
    tokens, mask = padded_batch(side)
    with torch.no_grad():
        ours, sdpa = (model(tokens, attention_mask=mask).logits[mask.bool()].float()
                      for model in models)
    assert (ours - sdpa).abs().max() <= TOLERANCE * sdpa.abs().max()
    assert kernel_calls["varlen_forward"] == 2 and not kernel_calls["forward"]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_on_a_left_padded_batch_gives_sdpas_tokens(cache, models, kernel_calls):
    tokens, mask = padded_batch("left")
    generations = []
    for model in models:
        model.generation_config.cache_implementation = "static" if cache == "static" else None
        generations.append(generate(model, tokens, mask, 24))
    compared = compare_generations(*generations, tokens.shape[1], TOLERANCE)
    assert compared["all_near_ties"], compared
    # The prefill runs the variable-length kernel, the 23 decoding steps the decode kernel
    # (on the padded cache, each row's keys from its padding mask), in both layers.
    assert kernel_calls["varlen_forward"] == 2 and kernel_calls["decode"] == 2 * 23


def test_generate_at_head_dim_96_decodes_on_padded_tiles(kernel_calls):
    """A model of head dim 96 (Phi's): its decoding steps in the decode kernel, on 128-column
    tiles, not in the variable-length kernel."""
    tokens, mask = padded_batch("left")
    generations = [generate(llama(implementation, head_dim=96), tokens, mask, 24)
                   for implementation in (backend.register(), "sdpa")]
    compared = compare_generations(*generations, tokens.shape[1], TOLERANCE)
    assert compared["all_near_ties"], compared
    assert kernel_calls["varlen_forward"] == 2 and kernel_calls["decode"] == 2 * 23


def test_generate_with_a_static_cache_compiled_into_cuda_graphs(models, monkeypatch):
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    from cutile_fmha import kvcache

    # Counted where the decode operator runs, not where dynamo traces: a count read while
    # tracing would be guarded on and recompile every step.
    launches = []
    decode_forward = kvcache.decode_forward
    monkeypatch.setattr(kvcache, "decode_forward",
                        lambda *args, **kwargs: launches.append(1) or decode_forward(*args,
                                                                                    **kwargs))
    tokens, mask = padded_batch("left")
    generations = []
    for model in models:
        torch._dynamo.reset()
        counters.clear()
        model.generation_config.cache_implementation = "static"
        model.generation_config.compile_config = CompileConfig(fullgraph=True,
                                                               mode="reduce-overhead")
        generations.append(generate(model, tokens, mask, 24))
        model.generation_config.compile_config = None
        # The decoding steps ran compiled as one graph (the key mask keeps the step's
        # shapes: no recompile per cache length), as CUDA graphs.
        assert counters["stats"]["unique_graphs"] == 1
        assert counters["inductor"]["cudagraph_skips"] == 0
    compared = compare_generations(*generations, tokens.shape[1], TOLERANCE)
    assert compared["all_near_ties"], compared
    assert launches  # through the decode kernel


def test_packed_training_batch_gives_the_padded_batchs_loss_and_gradients():
    from cutile_fmha.assets.fmha_llama_demo import packed

    ours = llama(backend.register(), torch.float16).train()
    twin = llama(backend.register(), torch.float16).train()
    twin.load_state_dict(ours.state_dict())
    tokens, mask = padded_batch("right")
    labels = tokens.masked_fill(mask == 0, -100)
    labels[:, 0] = -100  # the packed batch's first token of each sequence predicts nothing
    padded_loss = twin(tokens, attention_mask=mask, labels=labels).loss
    padded_loss.backward()
    batch = packed(tokens, mask)
    starts = batch["position_ids"][0] == 0
    packed_labels = batch["input_ids"].masked_fill(starts[None], -100)
    packed_loss = ours(**batch, labels=packed_labels).loss
    packed_loss.backward()
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-3, atol=1e-3)
    for (name, mine), theirs in zip(ours.named_parameters(), twin.parameters()):
        scale = theirs.grad.abs().max()
        assert (mine.grad - theirs.grad).abs().max() <= 2e-2 * scale, name


# The demo's Gemma-2-like (softcap, sliding window every other layer) and gpt-oss-like
# (sinks, sliding windows; two experts both used by every token) models at a small size.
VARIANT_MODELS = {
    "gemma2": ["--architecture", "gemma2", "--layers", "4", "--heads", "4", "--softcap", "20"],
    "gpt-oss": ["--architecture", "gpt-oss", "--layers", "2", "--heads", "8"]}


@pytest.mark.parametrize("architecture", sorted(VARIANT_MODELS))
def test_softcap_sliding_window_and_sink_models_give_eagers_logits(architecture):
    """Prefill past the window, then greedy decoding through the variants' kernel."""
    from cutile_fmha.assets import fmha_llama_demo as demo

    args = demo.parse_args(VARIANT_MODELS[architecture] + [
        "--hidden-size", "512", "--kv-heads", "2", "--vocab-size", "512", "--seq-len", "300",
        "--new-tokens", "8", "--sliding-window", "64"])
    ours, eager = (model.eval() for model in demo.build_models(args, torch.device("cuda"),
                                                                torch.bfloat16))
    tokens = torch.randint(1, 512, (2, 300), device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(3))
    with torch.no_grad():
        logits = [model(tokens).logits.float() for model in (ours, eager)]
    assert (logits[0] - logits[1]).abs().max() <= TOLERANCE * logits[1].abs().max()
    generations = [generate(model, tokens, torch.ones_like(tokens), 8) for model in (ours, eager)]
    compared = compare_generations(*generations, tokens.shape[1], TOLERANCE)
    assert compared["all_near_ties"], compared
    # Left-padded prompts: the variable-length kernel with the variants, prefill and decoding.
    padded, mask = tokens.clone(), torch.ones_like(tokens)
    mask[1, :120] = 0
    padded[1, :120] = 0
    generations = [generate(model, padded, mask, 8) for model in (ours, eager)]
    compared = compare_generations(*generations, tokens.shape[1], TOLERANCE)
    assert compared["all_near_ties"], compared


def expected_runs(row: list[int]) -> tuple[int, int, int]:
    """(first real column, one past the last, status) of one mask row, as
    kernels/padding.py defines them."""
    from cutile_fmha.kernels.padding import NO_PADDING, ONE_RUN, RUNS

    real = [column for column, value in enumerate(row) if value]
    if not real:
        return 0, 0, NO_PADDING if not row else ONE_RUN
    runs = sum(1 for column in real if column == 0 or not row[column - 1])
    return real[0], real[-1] + 1, RUNS if runs > 1 else \
        NO_PADDING if len(real) == len(row) else ONE_RUN


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64])
def test_padding_runs_find_each_rows_real_tokens(dtype):
    """One launch finds each row's real tokens in masks of every kind (left and right
    padding, none, all padding, holes, one token), lengths across the kernel's 1024-column
    turns, a row stride other than the length (a slice, as a mask's last kv_length columns)."""
    from cutile_fmha.steps.padding import padding_runs

    generator = torch.Generator().manual_seed(3)
    for length in (1, 5, 1023, 1024, 1025, 3000):
        rows = [[1] * length, [0] * length]
        for _ in range(6):
            start, end = sorted(torch.randint(0, length + 1, (2,), generator=generator).tolist())
            rows.append([int(start <= column < end) for column in range(length)])
        holes = [int(value) for value in torch.rand(length, generator=generator) < 0.5]
        rows += [holes, [0] * (length - 1) + [1], [1] + [0] * (length - 1)]
        mask = torch.tensor(rows, dtype=dtype)
        wider = torch.zeros(len(rows), length + 7, dtype=dtype)
        wider[:, 7:] = mask
        for on_gpu in (mask.cuda(), wider.cuda()[:, 7:]):
            on_gpu_runs = padding_runs(on_gpu)
            assert on_gpu_runs.dtype == torch.int32 and on_gpu_runs.shape == (3, len(rows))
            assert [tuple(column) for column in on_gpu_runs.T.tolist()] == \
                [expected_runs(row) for row in rows], length


def test_padding_mask_on_the_gpu_checks_and_bounds_as_on_the_cpu():
    """padding_mask and the bounds of a CUDA mask (the padding-runs kernel) agree with the
    CPU's (PyTorch operations): the mask handed over, the key bounds, and the error for
    padding between real tokens."""
    mask = torch.ones(4, 40, dtype=torch.long)
    for row, pad in enumerate((0, 3, 20, 39)):
        mask[row, :pad] = 0
    for q_length, kv_length in ((40, 40), (1, 40), (1, 48)):  # prefill, decoding, StaticCache
        handed = {device: backend.padding_mask(4, q_length, kv_length,
                                               attention_mask=mask.to(device))
                  for device in ("cpu", "cuda")}
        assert torch.equal(handed["cuda"].cpu(), handed["cpu"])
        bounds = [backend.key_bounds_of_padding(m) for m in handed.values()]
        assert [[t.tolist() for t in b] for b in bounds] == [[[0, 3, 20, 39], [40] * 4]] * 2
    assert backend.padding_mask(4, 40, 40, attention_mask=torch.ones_like(mask).cuda()) is None
    mask[1, 10] = 0
    with pytest.raises(ValueError, match="padding between real tokens"):
        backend.padding_mask(4, 1, 40, attention_mask=mask.cuda())
