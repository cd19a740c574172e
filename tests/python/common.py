"""Shared pieces of the PyTorch tests: the skip rule, a small model, the float64
reference of MLA attention (written from MLA.md, independent of mlagen) and the
per-element comparison."""
import os
import sys

FORMS = ["explicit", "absorbed", "laga", "laga-r", "laga-f", "laga-cp"]

# A tiny MLA shape within the kernels' rules (d_n, d_r, d_v multiples of 16, d_c of 32).
TINY = {"model_type": "deepseek_v3", "num_attention_heads": 4, "kv_lora_rank": 32,
        "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 32, "beta_fast": 32,
                         "beta_slow": 1}}


def in_ci():
    """In CI: $CI set, and not empty, "0" or "false" (cmake/MlagenCI.cmake owns the rule;
    tests/ci_rule.cmake holds this copy to it)."""
    return os.environ.get("CI", "") not in ("", "0", "false")


def require(*modules):
    """Imports modules; when one is missing: exit 77 (ctest: skipped) outside CI, 1 in CI
    (in_ci()), as tests/tool_missing.sh."""
    import importlib
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            print(f"not found: python module {m} ({e}); scripts/setup.sh --test installs it",
                  file=sys.stderr)
            sys.exit(1 if in_ci() else 77)


def reference(q, c_kv, k_rope, w_kv_b, scale, causal=True):
    """o [B, S, H, d_v] of MLA attention, explicit, in the inputs' dtype (float64)."""
    import torch
    B, S, H, dqk = q.shape
    d_r = k_rope.shape[-1]
    d_n = dqk - d_r
    kv = (c_kv @ w_kv_b.T).view(B, S, H, -1)
    k = torch.cat([kv[..., :d_n], k_rope[:, :, None, :].expand(B, S, H, d_r)], -1)
    v = kv[..., d_n:]
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)


def packed_reference(q, c_kv, k_rope, w_kv_b, cu, scale, causal, d_o):
    """o and the gradients (dq, dc_kv, dk_rope, dw_kv_b) of a packed stream (THD: q [T_cap,
    H, d_n + d_r], c_kv [T_cap, d_c], k_rope [T_cap, d_r], d_o [T_cap, H, d_v]; cu a list of
    N + 1 boundaries), each document run alone through reference() and back-propagated:
    slack rows (from cu[-1] on) 0, dw_kv_b the sum of the documents' parts. float64."""
    import torch
    w = w_kv_b.detach().requires_grad_()
    H, d_v = d_o.shape[1], d_o.shape[2]
    o = q.new_zeros(q.shape[0], H, d_v)
    grads = [torch.zeros_like(t) for t in (q, c_kv, k_rope, w_kv_b)]
    for a, b in zip(cu[:-1], cu[1:]):
        if a == b:
            continue
        x = [t.detach()[None, a:b].requires_grad_() for t in (q, c_kv, k_rope)]
        od = reference(*x, w, scale, causal)
        g = torch.autograd.grad(od, x + [w], d_o[None, a:b])
        o[a:b] = od[0].detach()
        for k in range(3):
            grads[k][a:b] = g[k][0]
        grads[3] += g[3]
    return o, grads


def inputs(model, B, S, dtype, seed=0):
    """Random inputs with realistic spread (scores of std ~2), requires_grad set."""
    import torch
    g = torch.Generator().manual_seed(seed)
    H, dc, dr, dn, dv = (model.heads, model.kv_lora_rank, model.qk_rope_head_dim,
                         model.qk_nope_head_dim, model.v_head_dim)
    q = torch.randn(B, S, H, dn + dr, generator=g, dtype=torch.float64) * 1.5
    c_kv = torch.randn(B, S, dc, generator=g, dtype=torch.float64)
    k_rope = torch.randn(B, S, dr, generator=g, dtype=torch.float64) * 1.5
    w = torch.randn(H * (dn + dv), dc, generator=g, dtype=torch.float64) / dc ** 0.5 * 1.5
    return [t.to(dtype).requires_grad_() for t in (q, c_kv, k_rope, w)]


def packed_stream(model, lengths, T_cap, seed):
    """THD inputs q, c_kv, k_rope, w_kv_b and d_o of documents of lengths packed into T_cap
    rows, NaN in every slack row of q, c_kv, k_rope and d_o; and the boundaries (a list)."""
    import torch
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    q, c, k, w = (t.detach() for t in inputs(model, 1, T_cap, torch.float64, seed=seed))
    q, c, k = q[0].clone(), c[0].clone(), k[0].clone()
    d_o = torch.randn(T_cap, model.heads, model.v_head_dim, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(seed + 1))
    for t in (q, c, k, d_o):
        t[cu[-1]:] = float("nan")
    return q, c, k, w, d_o, cu


# Per-element tolerances, as a fraction of the tensor's largest reference magnitude (the
# GEMMs' rounding scales with it, not with each element). Measured here (B=2, S=24, every
# form and tensor): float64 errors <= 1.5e-15 max|ref|, float32 <= 3.6e-7 max|ref|.
TOL = {"float64": 3e-15, "float32": 8e-7}


def check_close(name, got, ref, tol, scale=None):
    """Per element |got - ref| <= tol max|ref|; raises naming the worst element. Returns
    the largest error as a fraction of max|ref|. scale: the magnitude instead of max|ref|
    (a rank's shard: the whole tensor's, whose terms its rounding comes from)."""
    import torch
    got, ref = got.detach().double(), ref.detach().double()
    if got.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}")
    if scale is None:
        scale = ref.abs().max().item()
    err = (got - ref).abs()
    bad = err > tol * scale
    if bad.any() or not torch.isfinite(got).all():
        i = int(err.flatten().nan_to_num(float("inf")).argmax())
        raise AssertionError(f"{name}: {int(bad.sum())} of {got.numel()} elements off; worst "
                             f"at {i}: got {got.flatten()[i].item():.17g}, reference "
                             f"{ref.flatten()[i].item():.17g} (bound {tol} x max|ref| "
                             f"{scale:.3g})")
    return err.max().item() / scale
