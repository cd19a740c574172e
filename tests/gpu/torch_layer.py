"""The whole MLA attention layer, forward and forward+backward, timed through mlagen's
PyTorch op (mlagen.torch.mla_attention: mlagen_forward / mlagen_backward of the C API on the
caller's stream) for each form, beside the same layer written in PyTorch with cuDNN's
attention (issue 14's layer target; tests/gpu/run.sh, step layer).

The layer is the op's boundary (../shared/MLA.md, docs/torch.md): inputs q [B, S, H, d_n +
d_r], c_kv [B, S, d_c], k_rope [B, S, d_r], w_kv_b [H (d_n + d_v), d_c]; output o [B, S, H,
d_v]; gradients of all four. The peer: kv = c_kv w_kv_b^T (cuBLAS), k = [k_nope ; k_rope
broadcast over the heads], scaled_dot_product_attention forced to the cuDNN backend, autograd
for the backward; then the same with PyTorch's own choice of SDPA backend (a second
peer row, and the reference where cuDNN refuses the shape). One rank of SP 8 on DeepSeek-V3 is H 16 at P 1 (no collectives: the
communication of each form is `mlagen plan`'s to predict). DeepSeek-V3's head dims and
softmax scale (configs/deepseek-v3.json), bf16, B 1, causal unless --causal 0.

Timing as tests/gpu/bench.c: CUDA events around each call, --warmup calls first (the first
one plans and JIT-compiles mlagen's kernels), the median of --iters, the same tensors in
every call. fwd: the forward under
torch.no_grad(); fwd_bwd: the forward, then torch.autograd.grad of all four inputs. Printed
per row: ms and, as a rate, attention FLOPs / time (MLA.md's convention: forward 2 H pairs
(d_qk + d_v), backward 2 H pairs (3 d_qk + 2 d_v), pairs S (S + 1) / 2 causal; the absorbed
form's own attention does more, so compare forms by time). Sanity (not a tolerance check:
tests/gpu/torch_cuda.py is that): each form's o against the peer's, max |diff| / rms(peer)
printed, exit 1 when it is over 0.1 (a gross error).

Usage: PYTHONPATH=python:tests/python MLAGEN_LIBRARY=build/libmlagen.so \\
  python3 tests/gpu/torch_layer.py OUTDIR [--seq 16384] [--heads 16] [--causal 1]
    [--forms explicit,laga,laga-r,laga-f,absorbed,laga-cp] [--iters 10] [--warmup 3]
    [--device cuda|cpu] [--dtype bfloat16|float32]
(--device cpu --seq 256: the same rows, float32, on the C API's CPU device and
PyTorch's CPU attention, timed with perf_counter: a way to try the script without a GPU.)
Writes OUTDIR/layer.csv. Exit 0 when every row ran, 1 on a failed row or sanity miss, 77
when torch sees no CUDA device."""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import mlagen
import mlagen.torch as mt
from common import inputs

HERE = os.path.dirname(os.path.abspath(__file__))
FORMS = "explicit,laga,laga-r,laga-f,absorbed,laga-cp"


def model_at(heads):
    """DeepSeek-V3's config (configs/deepseek-v3.json) at `heads` heads."""
    with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "configs", "deepseek-v3.json")) as f:
        cfg = json.load(f)
    cfg["num_attention_heads"] = heads
    return mlagen.Model(cfg)


def peer_layer(model, causal, cudnn):
    """The layer in PyTorch: up-projection, split key, attention by cuDNN (cudnn) or by
    PyTorch's own choice of SDPA backend."""
    dn, dv = model.qk_nope_head_dim, model.v_head_dim

    def run(q, c_kv, k_rope, w):
        B, S, H, _ = q.shape
        kv = (c_kv @ w.t()).view(B, S, H, dn + dv)
        k = torch.cat([kv[..., :dn], k_rope[:, :, None, :].expand(B, S, H, k_rope.shape[-1])], -1)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, kv[..., dn:]))
        if cudnn:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=model.softmax_scale)
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=model.softmax_scale)
        return o.transpose(1, 2)
    return run


def timed(fn, warmup, iters, cuda):
    """Median ms of iters calls of fn after warmup calls."""
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--causal", type=int, default=1, choices=(0, 1))
    ap.add_argument("--forms", default=FORMS)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", choices=("bfloat16", "float32"),
                    help="bfloat16 on cuda (the default there), float32 on cpu (its default)")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    want = "bfloat16" if cuda else "float32"  # what the C API runs on each device
    if a.dtype and a.dtype != want:
        ap.error(f"--device {a.device} runs {want}, not {a.dtype}")
    a.dtype = want
    if cuda and not torch.cuda.is_available():
        print("layer: torch sees no CUDA device", file=sys.stderr)
        return 77
    os.makedirs(a.outdir, exist_ok=True)
    dtype = getattr(torch, a.dtype)
    model = model_at(a.heads)
    H, S, causal = a.heads, a.seq, bool(a.causal)
    dn, dr, dv, dc = (model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim,
                      model.kv_lora_rank)
    # tests/python/common.py's inputs (scores of std ~2), made in float32 on the host
    x = [t.detach().to(device=a.device, dtype=dtype).requires_grad_()
         for t in inputs(model, 1, S, torch.float32, seed=1)]
    d_o = torch.randn(1, S, H, dv, generator=torch.Generator().manual_seed(2)).to(a.device, dtype)
    pairs = S * (S + 1) / 2 if causal else float(S) * S
    dqk = dn + dr
    fl_fwd = 2 * H * pairs * (dqk + dv)
    fl_bwd = 2 * H * pairs * (3 * dqk + 2 * dv)
    machine = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"layer: {machine}, torch {torch.__version__}; DeepSeek-V3 heads (d_n {dn}, d_r {dr}, "
          f"d_v {dv}, d_c {dc}), H {H}, B 1, S {S}, {'causal' if causal else 'non-causal'}, "
          f"{a.dtype}; attention FLOPs (MLA.md) fwd {fl_fwd:.3e}, bwd {fl_bwd:.3e}; median of "
          f"{a.iters} after {a.warmup} warm-up calls")

    rows, failed = [], []

    def bench(impl, form, fn):
        def fwd():
            with torch.no_grad():
                fn(*x)

        def fwd_bwd():
            torch.autograd.grad(fn(*x), x, d_o)
        try:
            t_f = timed(fwd, a.warmup, a.iters, cuda)
            t_fb = timed(fwd_bwd, a.warmup, a.iters, cuda)
        except Exception as e:  # a row that fails says why; the others still run
            failed.append(f"{impl} {form}")
            print(f"{impl:8s} {form:9s} FAILED: {type(e).__name__}: {e}")
            return
        r = dict(impl=impl, form=form, H=H, S=S, causal=int(causal), dtype=a.dtype, fwd_ms=t_f,
                 fwd_bwd_ms=t_fb, attn_tflops_fwd=fl_fwd / t_f / 1e9,
                 attn_tflops_fwd_bwd=(fl_fwd + fl_bwd) / t_fb / 1e9)
        rows.append(r)
        print(f"{impl:8s} {form:9s} fwd {t_f:9.3f} ms ({r['attn_tflops_fwd']:7.4g} TFLOP/s)   "
              f"fwd+bwd {t_fb:9.3f} ms ({r['attn_tflops_fwd_bwd']:7.4g} TFLOP/s)")

    # the peers: cuDNN's attention (CUDA), then PyTorch's own SDPA choice; the first that runs
    # is the speed ratios' reference and gives the sanity check's o
    peers = ([("cudnn", True)] if cuda else []) + [("sdpa-default", False)]
    peer_row, o_peer = None, None
    for name, cudnn in peers:
        peer = peer_layer(model, causal, cudnn)
        n = len(rows)
        bench("peer", name, peer)
        if len(rows) > n and peer_row is None:
            peer_row = rows[-1]
            with torch.no_grad():
                o_peer = peer(*x).float()
    if o_peer is None:
        print("layer: no peer ran: no speed ratios, no sanity check")
    rms = o_peer.pow(2).mean().sqrt().item() if o_peer is not None else 0.0
    for form in a.forms.split(","):
        def fn(q, c, k, w, form=form):
            return mt.mla_attention(q, c, k, w, model=model, form=form, causal=causal)
        bench("mlagen", form, fn)
        if not rows or rows[-1]["form"] != form or o_peer is None:
            continue
        with torch.no_grad():
            diff = (fn(*x).float() - o_peer).abs().max().item() / rms
        rows[-1]["o_vs_peer"] = diff
        ratio = (f"; {peer_row['fwd_ms'] / rows[-1]['fwd_ms']:.2f}x / "
                 f"{peer_row['fwd_bwd_ms'] / rows[-1]['fwd_bwd_ms']:.2f}x {peer_row['form']}'s "
                 f"speed (fwd / fwd+bwd)")
        print(f"         {form:9s} o vs peer: max |diff| / rms {diff:.2e}{ratio}")
        if not diff <= 0.1:
            failed.append(f"sanity {form}")
    with open(os.path.join(a.outdir, "layer.csv"), "w") as f:
        keys = ["impl", "form", "H", "S", "causal", "dtype", "fwd_ms", "fwd_bwd_ms",
                "attn_tflops_fwd", "attn_tflops_fwd_bwd", "o_vs_peer"]
        f.write(",".join(keys) + "\n")
        for r in rows:
            f.write(",".join(str(r.get(k, "")) for k in keys) + "\n")
    print(f"layer: {len(rows)} rows timed" + (f"; failed: {', '.join(failed)}" if failed else "")
          + f" ({os.path.join(a.outdir, 'layer.csv')})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
