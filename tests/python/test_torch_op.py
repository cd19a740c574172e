"""mlagen.torch.mla_attention on the CPU device at P = 1: gradcheck in float64 for every
form; outputs and every gradient against the float64 reference (common.reference) in
float64 and float32; MLACoreAttention's plan cache; bad input raises with the C API's
message; MLACoreAttention and Model survive copy.deepcopy and torch.save/load; torch.compile
keeps the op in its graph (a model's first call too); packed sequences (cu_seqlens) against
each document run alone. Usage: test_torch_op.py
[gradcheck|values|errors|copies|compiled|packed] (no argument: all)."""
import sys

from common import (FORMS, TINY, TOL, check_close, inputs, packed_reference, packed_stream,
                    reference, require)

require("torch")
import torch  # noqa: E402

import mlagen  # noqa: E402
import mlagen.torch as mt  # noqa: E402

torch.manual_seed(0)


def gradcheck():
    # fast_mode: the analytical and numerical Jacobians compared along random directions
    # (3x less time than entry by entry); one dc_kv element of one form's backward made 1%
    # off fails it as the full check does
    small = dict(TINY, num_attention_heads=2)  # fewer weight entries to perturb
    model = mlagen.Model(small)
    for form in FORMS:
        args = inputs(model, 1, 6, torch.float64, seed=1)
        ok = torch.autograd.gradcheck(
            lambda q, c, k, w: mt.mla_attention(q, c, k, w, model=model, form=form), args,
            eps=1e-6, atol=1e-8, rtol=1e-6, fast_mode=True)
        assert ok, form
        print(f"gradcheck {form}: ok")


def values():
    model = mlagen.Model(TINY)
    B, S = 2, 24
    for dtype in (torch.float64, torch.float32):
        for causal in (True, False):
            ref_in = inputs(model, B, S, torch.float64, seed=2)
            o_ref = reference(*ref_in, model.softmax_scale, causal)
            d_o = torch.randn(o_ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
            ref_g = torch.autograd.grad(o_ref, ref_in, d_o)
            for form in FORMS:
                x = [t.detach().to(dtype).requires_grad_() for t in ref_in]
                o = mt.mla_attention(*x, model=model, form=form, causal=causal)
                assert o.dtype == dtype and o.shape == o_ref.shape, (o.dtype, o.shape)
                grads = torch.autograd.grad(o, x, d_o.to(dtype))
                tol = TOL[str(dtype).split(".")[1]]
                worst = [check_close(f"{form} {dtype} causal={causal} o", o, o_ref, tol)]
                for n, g, r in zip(("dq", "dc_kv", "dk_rope", "dw_kv_b"), grads, ref_g):
                    assert g.dtype == dtype, (n, g.dtype)
                    worst.append(check_close(f"{form} {dtype} causal={causal} {n}", g, r, tol))
                print(f"values {form} {dtype} causal={causal}: max err {max(worst):.1e} max|ref|")
    # the module caches one plan per (B, S, dtype, device)
    core = mt.MLACoreAttention(model, form="laga")
    a = inputs(model, 1, 8, torch.float64)
    core(*a)
    core(*a)
    assert len(core._plans) == 1, core._plans
    core(*inputs(model, 1, 16, torch.float64))
    core(*[t.detach().float() for t in a])
    assert len(core._plans) == 3, core._plans
    print("MLACoreAttention: one plan per (B, S, dtype, device)")
    # mlagen.torch.kernels: one entry per cached plan; CPU plans run no generated kernel
    ks = mt.kernels(core)
    assert len(ks) == 3 and all(v == [] for v in ks.values()), ks
    # a model given as a dict lives only in the autograd graph: a collection between the
    # passes must not free it (backward used to raise KeyError), and the gradients stay right
    import gc
    x = [t.detach().requires_grad_() for t in inputs(model, 1, 8, torch.float64, seed=5)]
    want = torch.autograd.grad(mt.mla_attention(*x, model=model, form="laga").sum(), x)
    o = mt.mla_attention(*x, model=dict(TINY), form="laga")
    gc.collect()
    mt.mla_attention(*x, model=dict(TINY), form="laga")  # a new owner, maybe at the same address
    gc.collect()
    got = torch.autograd.grad(o.sum(), x)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    print("a temporary model survives gc.collect() between forward and backward")


def compiled():
    """torch.compile(fullgraph=True) keeps the op in one graph (no graph break), forward
    and backward equal eager's bit for bit; torch.library.opcheck passes on both ops."""
    model = mlagen.Model(TINY)
    x = inputs(model, 2, 16, torch.float64, seed=4)

    def f(q, c, k, w):
        o = mt.mla_attention(q, c, k, w, model=model, form="laga-f")
        return (o * o).sum()

    # first: a Model the op has never seen, compiled before any eager call (its first
    # call used to make the model's owner inside the traced code: a graph break)
    fresh = mlagen.Model(TINY)
    cg = torch.compile(lambda q, c, k, w: mt.mla_attention(q, c, k, w, model=fresh, form="laga"),
                       backend="aot_eager", fullgraph=True)
    got0 = cg(*x)
    assert torch.equal(got0, mt.mla_attention(*x, model=fresh, form="laga"))
    print("torch.compile(fullgraph=True) of a model's first call: one graph, equal to eager")
    want = f(*x)
    want_g = torch.autograd.grad(want, x)
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    got = cf(*x)
    got_g = torch.autograd.grad(got, x)
    assert torch.equal(got, want), (got, want)
    for a, b in zip(got_g, want_g):
        assert torch.equal(a, b)
    print("torch.compile(fullgraph=True, aot_eager): one graph, equal to eager")
    args = (*x, mt._owner_of(model).key, "laga", True, 0, "")
    torch.library.opcheck(mt._fwd, args)
    o, saved = mt._fwd(*args)
    d = [t.detach() for t in x]
    torch.library.opcheck(mt._bwd, (torch.randn_like(o), *d, o.detach(), saved, *args[4:]))
    print("torch.library.opcheck(mlagen::mla_attention_fwd, _bwd): ok")


def expect(what, fn, exc, *needles):
    try:
        fn()
    except exc as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"{what}: {n!r} not in {msg!r}"
        print(f"errors {what}: {type(e).__name__}: {msg}")
        return
    raise AssertionError(f"{what}: no {exc.__name__} raised")


def errors():
    model = mlagen.Model(TINY)
    q, c, k, w = (t.detach() for t in inputs(model, 1, 8, torch.float64))
    run = lambda *a, **kw: mt.mla_attention(*a, model=model, **kw)  # noqa: E731
    expect("wrong shape", lambda: run(q, c[:, :7], k, w), mlagen.MlagenError,
           "MLAGEN_EINVAL", "tensors->c_kv.dims[1] = 7")
    expect("wrong w_kv_b", lambda: run(q, c, k, w[:-1]), mlagen.MlagenError,
           "tensors->w_kv_b.dims[0]")
    expect("q rank", lambda: run(q[0], c, k, w), ValueError, "[B, S_l, H, d_n + d_r]",
           "cu_seqlens", "got (8, 4, 32)")
    expect("wrong dtype", lambda: run(q, c.float(), k, w), mlagen.MlagenError,
           "tensors->c_kv.dtype is f32, the plan expects f64")
    expect("int dtype", lambda: run(q, c.long(), k, w), ValueError, "c_kv is torch.int64")
    expect("int q", lambda: run(q.int(), c, k, w), ValueError, "q is torch.int32")
    expect("bf16 on the CPU", lambda: run(*(t.bfloat16() for t in (q, c, k, w))),
           mlagen.MlagenError, "MLAGEN_EUNSUPPORTED", "CPU device")
    expect("wrong device", lambda: run(q, c.to("meta"), k, w), ValueError, "c_kv is on meta")
    expect("bad form", lambda: run(q, c, k, w, form="flash"), ValueError, "form = 'flash'")
    expect("bad head_groups", lambda: run(q, c, k, w, form="laga-f", head_groups=3),
           mlagen.MlagenError, "plan_desc->head_groups")
    expect("head_groups for laga", lambda: run(q, c, k, w, form="laga", head_groups=2),
           mlagen.MlagenError, "plan_desc->head_groups")
    # ints beyond a C int used to be truncated by ctypes (2**32 + 2 ran as 2)
    expect("head_groups beyond int", lambda: run(q, c, k, w, form="laga-f", head_groups=2**32 + 2),
           ValueError, "head_groups = 4294967298 does not fit a C int")
    huge = q[:1].expand(2**32 + 2, *q.shape[1:])  # a view: nothing allocated
    expect("batch beyond int", lambda: run(huge, c, k, w), ValueError,
           "batch = 4294967298 does not fit a C int")
    expect("bad config", lambda: mlagen.Model({"num_attention_heads": 4}), mlagen.MlagenError,
           "MLAGEN_ECONFIG", "kv_lora_rank")
    expect("missing file", lambda: mlagen.Model("/nonexistent/config.json"), mlagen.MlagenError,
           "MLAGEN_EIO")
    # token_positions: seq beyond int64 or not an integer (ctypes used to wrap 2**64 + 8 to 8
    # and int() truncated 2.7 to 2)
    expect("seq beyond int64", lambda: mlagen.token_positions("laga", 2**64 + 8, 2, 0),
           ValueError, "seq = 18446744073709551624 does not fit int64")
    expect("float seq", lambda: mlagen.token_positions("laga", 2.7, 1, 0), TypeError,
           "seq = 2.7 is a float")
    expect("sp_size beyond int", lambda: mlagen.token_positions("laga", 8, 2**32 + 2, 0),
           ValueError, "sp_size = 4294967298 does not fit a C int")
    assert mlagen.token_positions("laga-cp", 8, 2, 1) == [2, 3, 4, 5]


def copies():
    """copy.deepcopy and torch.save / torch.load of MLACoreAttention (and of a Model): the
    copy computes what the original does, bit for bit, with a plan cache of its own."""
    import copy
    import io
    core = mt.MLACoreAttention(mlagen.Model(TINY), form="laga-r")
    x = inputs(core.model, 1, 12, torch.float64, seed=6)
    want = core(*x)
    want_g = torch.autograd.grad(want.sum(), x)
    buf = io.BytesIO()
    torch.save(core, buf)
    buf.seek(0)
    for name, c in (("deepcopy", copy.deepcopy(core)),
                    ("torch.save/load", torch.load(buf, weights_only=False))):
        assert c.model is not core.model and c._plans is not core._plans and not c._plans
        assert c._owner.key != core._owner.key
        assert (c.model.heads, c.model.softmax_scale) == (core.model.heads, core.model.softmax_scale)
        got = c(*x)
        assert torch.equal(got, want), name
        for a, b in zip(torch.autograd.grad(got.sum(), x), want_g):
            assert torch.equal(a, b), name
        print(f"MLACoreAttention {name}: equal to the original, plans of its own")
    m = copy.deepcopy(core.model)
    o = mt.mla_attention(*x, model=m, form="laga-r")
    assert torch.equal(o, want) and m.plans and m.plans is not core.model.plans
    print("Model deepcopy: equal results, plans of its own")


def packed():
    """Packed sequences at P = 1, every form, causal and not: documents of lengths 5, 0,
    12, 1, 11 in 32 rows (NaN in the 3 slack rows): o and every gradient equal each
    document run alone through the reference (dw_kv_b: their sum) per element; the slack
    rows of o, dq, dc_kv and dk_rope exactly 0. One plan per capacity, whatever the
    documents; bad boundaries raise naming the index; torch.compile keeps cu_seqlens."""
    model = mlagen.Model(TINY)
    q, c, k, w, d_o, cu = packed_stream(model, [5, 0, 12, 1, 11], 32, seed=7)
    T = cu[-1]
    for causal in (True, False):
        o_ref, g_ref = packed_reference(q, c, k, w, cu, model.softmax_scale, causal, d_o)
        for form in FORMS:
            x = [t.clone().requires_grad_() for t in (q, c, k, w)]
            # int32 boundaries on one pass, int64 on the other
            cu_t = torch.tensor(cu, dtype=torch.int32 if causal else torch.int64)
            o = mt.mla_attention(*x, model=model, form=form, causal=causal, cu_seqlens=cu_t)
            assert o.shape == o_ref.shape, o.shape
            grads = torch.autograd.grad(o, x, d_o)
            what = f"packed {form} causal={causal}"
            worst = [check_close(f"{what} o", o, o_ref, TOL["float64"])]
            for n, g, r in zip(("dq", "dc_kv", "dk_rope", "dw_kv_b"), grads, g_ref):
                worst.append(check_close(f"{what} {n}", g, r, TOL["float64"]))
            for n, t in zip(("o", "dq", "dc_kv", "dk_rope"), (o, *grads[:3])):
                assert torch.equal(t[T:], torch.zeros_like(t[T:])), f"{what} {n}: slack rows"
            print(f"{what}: max err {max(worst):.1e} max|ref|, slack rows 0")
    # one plan per capacity (a varlen key of its own), whatever the documents
    core = mt.MLACoreAttention(model, form="laga")
    for docs in ([0, 5, 29], [0, 32], [0]):
        core(q, c, k, w, cu_seqlens=torch.tensor(docs))
    assert len(core._plans) == 1, core._plans
    core(q[None], c[None], k[None], w)  # [1, 32] unpacked: another plan
    core(q[:16], c[:16], k[:16], w, cu_seqlens=torch.tensor([0, 16]))
    assert len(core._plans) == 3, core._plans
    print("packed: one plan per capacity, whatever the documents")

    def run(docs):
        return mt.mla_attention(q, c, k, w, model=model, cu_seqlens=docs)
    t = torch.tensor
    expect("decreasing", lambda: run(t([0, 5, 17, 12, 29])), mlagen.MlagenError,
           "MLAGEN_EINVAL", "tensors->cu_seqlens[3] = 12 is below tensors->cu_seqlens[2] = 17")
    expect("first not 0", lambda: run(t([1, 5])), mlagen.MlagenError, "cu_seqlens[0] = 1")
    expect("past capacity", lambda: run(t([0, 5, 33])), mlagen.MlagenError,
           "cu_seqlens[2] = 33 is past the plan's token capacity 32")
    expect("no entry", lambda: run(t([], dtype=torch.int32)), mlagen.MlagenError,
           "cu_seqlens needs at least one entry")
    expect("int64 beyond int32", lambda: run(t([0, 5, 2**32 + 5])), ValueError,
           "cu_seqlens[2] = 4294967301 does not fit int32")
    expect("float boundaries", lambda: run(t([0.0, 5.0])), ValueError,
           "1-D int32 or int64 tensor")
    expect("2-d boundaries", lambda: run(t([[0, 5]])), ValueError, "1-D int32 or int64")
    expect("a list", lambda: run([0, 5]), TypeError, "cu_seqlens is a list")
    expect("batched tensors", lambda: mt.mla_attention(q[None], c[None], k[None], w,
                                                       model=model, cu_seqlens=t([0, 5])),
           ValueError, "with cu_seqlens q must be a tensor [T_l, H, d_n + d_r]")

    # torch.compile(fullgraph=True) keeps the boundaries in its graph: equal to eager
    x = [t_.clone().nan_to_num().requires_grad_() for t_ in (q, c, k, w)]
    cu_t = torch.tensor(cu, dtype=torch.int32)

    def f(q_, c_, k_, w_, cu_):
        o = mt.mla_attention(q_, c_, k_, w_, model=model, form="laga-cp", cu_seqlens=cu_)
        return (o * o).sum()
    want = f(*x, cu_t)
    want_g = torch.autograd.grad(want, x)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(*x, cu_t)
    got_g = torch.autograd.grad(got, x)
    assert torch.equal(got, want), (got, want)
    for a, b in zip(got_g, want_g):
        assert torch.equal(a, b)
    print("packed: torch.compile(fullgraph=True, aot_eager) equal to eager")


if __name__ == "__main__":
    parts = {"gradcheck": gradcheck, "values": values, "errors": errors, "copies": copies,
             "compiled": compiled,
             "packed": packed}
    for name in sys.argv[1:] or parts:
        parts[name]()
    print("ok")
