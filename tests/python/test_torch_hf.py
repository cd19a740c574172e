"""The real client: a tiny DeepSeek-V3 (or -V2) built by HF transformers' own modeling code
(random initialization, 2 layers, 4 heads, small dims, yarn RoPE scaling), float64, with the
core of every attention layer (after RoPE, before o_proj) replaced by
mlagen.torch.mla_attention, for each form. Logits, loss and every parameter's gradient
equal the unmodified model's, and ten AdamW steps give the same losses.

The reference is the unmodified model with attn_implementation="sdpa" (PyTorch's math
kernel on the CPU, float64 throughout): HF's eager attention takes its softmax in float32
even for float64 inputs (eager_attention_forward: softmax(..., dtype=torch.float32)), so it
is float32-accurate only; the eager model is compared too, with a float32-level bound.

The replacement keeps the model's code path: each attention module's expand_kv (which
turns the latent into per-head K/V) is swapped for one that keeps the latent (kv_nope,
k_rot: after kv_a_layernorm and RoPE) for the registered attention function "mlagen",
which calls mla_attention with q (after RoPE), the latent, k_rot and kv_b_proj.weight.
Usage: test_torch_hf.py v3|v2... (each model in turn, in one process: torch and
transformers imported once)."""
import copy
import sys

from common import FORMS, check_close, require

require("torch", "transformers")
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AttentionInterface  # noqa: E402

import mlagen  # noqa: E402
import mlagen.torch as mt  # noqa: E402

# Measured (float64, every form, V3 and V2): logits, loss and every gradient within ~1e-15
# of the tensor's max|ref|; the ten steps' losses within ~1e-15 relative. Bounds: about
# twice the worst.
TOL_F64, TOL_STEPS = 2e-15, 2e-15
TOL_EAGER = 3e-7  # the eager model's float32 softmax (measured 9.3e-8 V3, 1.4e-7 V2)
CALLS = [0]

ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "rope_theta": 10000.0}
COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
              n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
              first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=32,
              q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
              max_position_embeddings=128, rope_scaling=ROPE, tie_word_embeddings=False)


def build(which, attn):
    if which == "v3":
        cfg = transformers.DeepseekV3Config(**COMMON)
        cls = transformers.DeepseekV3ForCausalLM
    else:
        cfg = transformers.DeepseekV2Config(**COMMON)
        cls = transformers.DeepseekV2ForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).double()
    model.set_attn_implementation(attn)
    if hasattr(model, "set_experts_implementation"):  # grouped_mm has no float64
        model.set_experts_implementation("eager")
    return model


def mlagen_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    kv_nope, k_rot = module.mlagen_latent  # [B, 1, S, d_c], [B, 1, S, d_r]
    CALLS[0] += 1
    o = mt.mla_attention(query.transpose(1, 2), kv_nope[:, 0], k_rot[:, 0],
                         module.kv_b_proj.weight, model=module.mlagen_model,
                         form=module.mlagen_form)
    return o, None  # [B, S, H, d_v], as eager's attn_output


AttentionInterface.register("mlagen", mlagen_attention)


def use_mlagen(model, form):
    """Swaps every attention core of model for mla_attention (form)."""
    mm = mlagen.Model(model.config)  # the C API reads the HF config, scale and all
    for layer in model.model.layers:
        attn = layer.self_attn
        assert abs(attn.scaling - mm.softmax_scale) <= 1e-15 * attn.scaling, \
            (attn.scaling, mm.softmax_scale)

        def keep_latent(kv_nope, k_rot, attn=attn):
            attn.mlagen_latent = (kv_nope, k_rot)
            return kv_nope, k_rot  # placeholders: the "mlagen" attention reads the latent

        attn.expand_kv = keep_latent
        attn.mlagen_model, attn.mlagen_form = mm, form
    model.set_attn_implementation("mlagen")
    return model


def lm_loss(model, ids):
    """Logits and the next-token cross-entropy in float64 (HF's own loss casts the logits
    to float32, which would hide float64 differences)."""
    logits = model(input_ids=ids).logits
    return logits, torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                     ids[:, 1:].flatten())


def step_losses(model, ids, n=10):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(n):
        opt.zero_grad()
        loss = lm_loss(model, ids)[1]
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def forward_backward(model, ids):
    model.zero_grad()
    logits, loss = lm_loss(model, ids)
    assert loss.dtype == torch.float64
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad.clone() for n, p in
                                            model.named_parameters()}


def main():
    for which in sys.argv[1:]:
        check_model(which)
    print("ok")


def check_model(which):
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    ref = build(which, "sdpa")
    init = copy.deepcopy(ref.state_dict())
    logits_r, loss_r, grads_r = forward_backward(ref, ids)
    assert all(g.abs().max() > 0 for n, g in grads_r.items() if "kv_b_proj" in n)
    eager = build(which, "eager")
    eager.load_state_dict(init)
    logits_e, loss_e, _ = forward_backward(eager, ids)
    e = check_close("eager logits (float32 softmax)", logits_e, logits_r, TOL_EAGER)
    print(f"{which}: eager vs sdpa logits {e:.1e} max|ref| (eager's float32 softmax)")
    ref.load_state_dict(init)
    losses_r = step_losses(ref, ids)
    for form in FORMS:
        m = use_mlagen(build(which, "sdpa"), form)
        m.load_state_dict(init)
        CALLS[0] = 0
        logits, loss, grads = forward_backward(m, ids)
        assert CALLS[0] == COMMON["num_hidden_layers"], CALLS  # every layer went through mlagen
        worst = check_close(f"{form} logits", logits, logits_r, TOL_F64)
        worst = max(worst, check_close(f"{form} loss", loss, loss_r, TOL_F64))
        assert grads.keys() == grads_r.keys()
        for n in grads_r:
            worst = max(worst, check_close(f"{form} grad {n}", grads[n], grads_r[n], TOL_F64))
        losses = step_losses(m, ids)
        rel = max(abs(a - b) / abs(b) for a, b in zip(losses, losses_r))
        assert rel <= TOL_STEPS, (form, losses, losses_r)
        print(f"{which} {form}: logits, loss, {len(grads)} gradients within {worst:.1e} "
              f"max|ref|; 10 AdamW steps' losses within {rel:.1e} (first {losses[0]:.15f}, "
              f"last {losses[-1]:.15f})")


if __name__ == "__main__":
    main()
