"""The transformers attention backend: registration, masks, and a small Llama on the CPU
with the kernels replaced by the reference (the kernels themselves are checked on the GPU
in test_gpu_correctness.py and test_gpu_backward.py)."""

import pytest
import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

transformers = pytest.importorskip("transformers")

from cutile_fmha import transformers_backend as backend  # noqa: E402


def test_registers_under_its_own_name_and_never_replaces_transformers_own():
    from transformers import AttentionInterface

    assert backend.register() == "cutile_fmha"
    assert AttentionInterface()["cutile_fmha"] is backend.attention_forward
    for name in ("sdpa", "eager"):
        with pytest.raises(ValueError, match=f"name '{name}' is one of transformers' own"):
            backend.register(name)
    assert AttentionInterface()["sdpa"] is not backend.attention_forward


def causal(q_len, k_len):
    rows, keys = torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]
    return (keys <= rows + k_len - q_len).expand(2, 1, q_len, k_len)


def is_lower_right(mask, q_len, k_len):
    return (isinstance(mask, CausalBias) and mask.variant == CausalVariant.LOWER_RIGHT
            and (mask.seq_len_q, mask.seq_len_kv) == (q_len, k_len))


def test_masks_the_kernels_compute_themselves():
    assert is_lower_right(backend.causal_mask_of(None, 5, 5, True), 5, 5)
    assert is_lower_right(backend.causal_mask_of(None, 3, 8, True), 3, 8)  # after a cache
    assert backend.causal_mask_of(None, 1, 8, True) is None  # decoding sees every key
    assert backend.causal_mask_of(None, 5, 5, False) is None
    assert is_lower_right(backend.causal_mask_of(causal(4, 6), 4, 6, True), 4, 6)
    additive = torch.zeros(2, 1, 4, 6).masked_fill(~causal(4, 6), torch.finfo(torch.float32).min)
    assert is_lower_right(backend.causal_mask_of(additive, 4, 6, True), 4, 6)
    assert backend.causal_mask_of(torch.ones(2, 1, 4, 6, dtype=torch.bool), 4, 6, True) is None


def test_a_padding_mask_is_refused_not_ignored():
    padded = causal(4, 4).clone()
    padded[1, :, :, 0] = False  # the second sequence is left-padded
    with pytest.raises(ValueError, match="hides keys other than the causal ones"):
        backend.causal_mask_of(padded, 4, 4, True)
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, 1 or heads, 4, 4\)"):
        backend.causal_mask_of(torch.ones(4, 4, dtype=torch.bool), 4, 4, True)


@pytest.mark.parametrize("option,value", [("softcap", 30.0), ("sliding_window", 4096),
                                          ("output_attentions", True)])
def test_options_it_cannot_honour_raise(option, value):
    q = torch.zeros(1, 2, 4, 64)
    with pytest.raises(ValueError, match=option):
        backend.attention_forward(torch.nn.Module(), q, q, q, None, **{option: value})
    with pytest.raises(ValueError, match="no attention dropout"):
        backend.attention_forward(torch.nn.Module(), q, q, q, None, dropout=0.1)


def tiny_llama(attn_implementation):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


def test_a_small_llama_gives_sdpas_logits_and_gradients(kernels_on_the_cpu):
    name = backend.register()
    ours, sdpa = tiny_llama(name), tiny_llama("sdpa")
    sdpa.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens).logits, sdpa(tokens).logits, rtol=1e-4, atol=1e-4)
    loss = ours(tokens, labels=tokens).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in ours.parameters())
    assert kernels_on_the_cpu == {"forward": 2 * 2, "backward": 2}  # 2 layers
    padded = torch.ones_like(tokens)
    padded[1, :3] = 0
    with pytest.raises(ValueError, match="hides keys other than the causal ones"):
        ours(tokens, attention_mask=padded)


def test_llama_demo_runs_and_reports(kernels_on_the_cpu):
    from cutile_fmha.assets import fmha_llama_demo as demo

    args = demo.parse_args(["--layers", "1", "--hidden-size", "256", "--heads", "4",
                            "--kv-heads", "2", "--vocab-size", "64", "--batch", "2",
                            "--seq-len", "40", "--train-steps", "4", "--dtype", "float16"])
    # float32: what the kernels' CPU stand-in computes in; on the GPU the demo runs fp16/bf16
    result = demo.run(args, torch.device("cpu"), dtype=torch.float32)
    text, ok = demo.report(result, args)
    assert ok, text
    assert result["max_logit_difference"] < 1e-4 and len(result["losses"]["cutile_fmha"]) == 4
    # one layer: prefill once for the logits and 4 times timed, then 4 training steps
    assert kernels_on_the_cpu == {"forward": 1 + 4 + 4, "backward": 4}
    assert "tokens/s" in text and "prefill" in text
