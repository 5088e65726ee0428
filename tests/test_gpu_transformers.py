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


def llama(attn_implementation, dtype=torch.bfloat16):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024)
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
    torch._dynamo.reset()
    counters.clear()
    tokens, mask = padded_batch("left")
    generations = []
    for model in models:
        model.generation_config.cache_implementation = "static"
        model.generation_config.compile_config = CompileConfig(fullgraph=True,
                                                               mode="reduce-overhead")
        generations.append(generate(model, tokens, mask, 24))
        model.generation_config.compile_config = None
    compared = compare_generations(*generations, tokens.shape[1], TOLERANCE)
    assert compared["all_near_ties"], compared
    # The decoding steps ran compiled in one graph each way (fullgraph: a recompile past
    # the limit raises), as CUDA graphs, through the decode kernel.
    assert counters["stats"]["unique_graphs"] >= 1
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert launches


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


def gemma2_like(attn_implementation):
    """Gemma 2's attention: logit softcap, sliding window on every other layer."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=512, hidden_size=512, intermediate_size=1024,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=128, max_position_embeddings=2048, sliding_window=64,
                          attn_logit_softcapping=20.0, final_logit_softcapping=None,
                          query_pre_attn_scalar=128)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.to(device="cuda", dtype=torch.bfloat16).eval()


def gpt_oss_like(attn_implementation):
    """gpt-oss's attention: a learnable sink per head (s_aux), sliding windows on every
    other layer; two small experts, both used by every token, so that no near-tie in the
    router flips a token's experts between the two models."""
    from transformers import AutoModelForCausalLM, GptOssConfig

    torch.manual_seed(0)
    config = GptOssConfig(vocab_size=512, hidden_size=512, intermediate_size=512,
                          num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=64, num_local_experts=2, num_experts_per_tok=2,
                          sliding_window=64, max_position_embeddings=2048)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    with torch.no_grad():  # sinks start at zero: make them matter
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return model.to(device="cuda", dtype=torch.bfloat16).eval()


@pytest.mark.parametrize("make", [gemma2_like, gpt_oss_like], ids=["gemma2", "gpt-oss"])
def test_softcap_sliding_window_and_sink_models_give_eagers_logits(make):
    """Prefill past the window, then greedy decoding through the variants' kernel."""
    ours, eager = make(backend.register()), make("eager")
    eager.load_state_dict(ours.state_dict())
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
