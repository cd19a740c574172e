"""The PyTorch package's CUDA-tensor path (mlagen.torch.mla_attention on CUDA tensors: the C
API's CUDA executor on the caller's stream), checked per element against the float64
reference of tests/python/common.py on the CPU, on one GPU (tests/gpu/run.sh, step
torchcuda). Cases, DeepSeek-V3's head dims at H 16 (one rank of SP 8), B 2, S 300 (partial
tiles), P 1:
  - every form, bf16, causal: o and the four gradients (dq, dc_kv, dk_rope, dw_kv_b);
  - explicit non-causal (bf16) and explicit f16 (causal);
  - laga on a packed stream (cu_seqlens a CUDA int32 tensor: documents 1, 2, 0, 17, 200 and
    the rest of 480 rows in a capacity of 512, NaN in the slack rows of every input) against
    each document run alone (common.packed_reference): slack outputs and gradients 0;
  - the forward on a side stream (torch.cuda.stream) equal bit for bit to the same call on
    the current stream, and two calls equal bit for bit;
  - the check itself: one row of o moved by ten times its bound must fail it.
Tolerances: tests/gpu/gpu_tol.h, read here (the one owner), as the C checks apply them: per
element |got - ref| <= atol_rms rms(ref) + rtol |ref|, and ||got - ref|| / ||ref|| <= l2.
Prints one line per case and "torchcuda: N of N cases passed"; exit 1 on any failure, 77
when torch has no CUDA device. --device cpu runs the cases on the C API's CPU device in
float32 (no f16 case, no side stream) to try the script where there is no GPU.
Usage: PYTHONPATH=python:tests/python MLAGEN_LIBRARY=build/libmlagen.so \\
       python3 tests/gpu/torch_cuda.py [--device cuda|cpu] [--dtype bfloat16|float32]"""
import argparse
import os
import re
import sys

import torch

import mlagen.torch as mt
from common import FORMS, inputs, packed_reference, packed_stream, reference
from torch_layer import model_at

HERE = os.path.dirname(os.path.abspath(__file__))


def gpu_tol():
    """gpu_tol.h's #defines as a dict (GPU_TOL_ prefix dropped)."""
    with open(os.path.join(HERE, "gpu_tol.h")) as f:
        text = f.read()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"#define GPU_TOL_(\w+)\s+([0-9.eE+-]+)", text)}


TOL = gpu_tol()


def bounds(form, grad):
    """(atol_rms, rtol, l2) of an output (grad 0) or a gradient of form."""
    pre = "ABS_" if form == "absorbed" else ""
    kind = "GRAD" if grad else "O"
    return (TOL[f"{pre}{kind}_ATOL_RMS"], TOL["GRAD_RTOL" if grad else "RTOL"],
            TOL[f"{pre}{kind}_L2"])


def check(name, got, ref, form, grad, rows=None):
    """Per element and L2 against ref (float64, CPU); raises naming the worst element.
    Returns the largest error as a fraction of its element's bound. rows: the checked
    reference's rows for its rms (a packed stream's valid rows: forms_check.c leaves the
    slack out), all of them by default."""
    atol_rms, rtol, l2 = bounds(form, grad)
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    if got.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}")
    rms = (ref if rows is None else ref[:rows]).pow(2).mean().sqrt().item()
    err = (got - ref).abs()
    bound = atol_rms * rms + rtol * ref.abs()
    ratio = (err / bound).nan_to_num(float("inf"))
    if not torch.isfinite(got).all() or (ratio > 1).any():
        i = int(ratio.flatten().argmax())
        raise AssertionError(f"{name}: {int((ratio > 1).sum())} of {got.numel()} elements off; "
                             f"worst at {i}: got {got.flatten()[i].item():.6g}, reference "
                             f"{ref.flatten()[i].item():.6g}, bound {bound.flatten()[i].item():.3g}")
    rel = ((got - ref).norm() / ref.norm()).item() if ref.norm() > 0 else 0.0
    if rel > l2:
        raise AssertionError(f"{name}: L2 error {rel:.3g} over {l2:g}")
    return ratio.max().item()


def run_case(model, form, dtype, device, causal, B=2, S=300, seed=1):
    """o and the gradients of form against the float64 reference of the same rounded
    inputs; returns the worst error as a fraction of its bound."""
    x64 = [t.detach().to(dtype).double() for t in inputs(model, B, S, torch.float64, seed=seed)]
    ref_in = [t.clone().requires_grad_() for t in x64]
    o_ref = reference(*ref_in, model.softmax_scale, causal)
    g = torch.Generator().manual_seed(seed + 100)
    d_o = torch.randn(o_ref.shape, dtype=torch.float64, generator=g).to(dtype).double()
    ref_g = torch.autograd.grad(o_ref, ref_in, d_o)
    x = [t.to(device=device, dtype=dtype).requires_grad_() for t in x64]
    o = mt.mla_attention(*x, model=model, form=form, causal=causal)
    grads = torch.autograd.grad(o, x, d_o.to(device=device, dtype=dtype))
    tag = f"{form} {str(dtype)[6:]} causal={int(causal)} B={B} S={S}"
    worst = [check(f"{tag} o", o, o_ref, form, 0)]
    for n, gt, r in zip(("dq", "dc_kv", "dk_rope", "dw_kv_b"), grads, ref_g):
        worst.append(check(f"{tag} {n}", gt, r, form, 1))
    print(f"{tag}: ok, worst error {max(worst):.2f} of its bound")
    return o.detach(), o_ref


def packed_case(model, dtype, device):
    lengths, T_cap = [1, 2, 0, 17, 200, 260], 512
    q, c, k, w, d_o, cu = packed_stream(model, lengths, T_cap, seed=7)
    q, c, k, w, d_o = (t.to(dtype).double() for t in (q, c, k, w, d_o))
    o_ref, ref_g = packed_reference(q, c, k, w, cu, model.softmax_scale, True, d_o)
    x = [t.to(device=device, dtype=dtype).requires_grad_() for t in (q, c, k, w)]
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    o = mt.mla_attention(*x, model=model, form="laga", causal=True, cu_seqlens=cu_t)
    grads = torch.autograd.grad(o, x, d_o.to(device=device, dtype=dtype))  # NaN in the slack rows
    tag = f"laga packed {str(dtype)[6:]} documents {lengths} in {T_cap}"
    slack = cu[-1]
    worst = [check(f"{tag} o", o, o_ref, "laga", 0, slack)]
    for n, gt, r in zip(("dq", "dc_kv", "dk_rope", "dw_kv_b"), grads, ref_g):
        worst.append(check(f"{tag} {n}", gt, r, "laga", 1, None if n == "dw_kv_b" else slack))
    for n, t in (("o", o), ("dq", grads[0]), ("dc_kv", grads[1]), ("dk_rope", grads[2])):
        if not bool((t[slack:] == 0).all()):
            raise AssertionError(f"{tag}: {n} not 0 in the slack rows {slack}..{T_cap - 1}")
    print(f"{tag}: ok, worst error {max(worst):.2f} of its bound, slack rows 0")


def stream_case(model, dtype, device):
    x = [t.detach().to(device=device, dtype=dtype) for t in inputs(model, 2, 300, torch.float64, seed=3)]
    a = mt.mla_attention(*x, model=model, form="laga")
    b = mt.mla_attention(*x, model=model, form="laga")
    if not torch.equal(a, b):
        raise AssertionError("laga forward: two calls differ")
    if device != "cuda":
        print("laga forward: two calls equal bit for bit (no side stream on the CPU)")
        return
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c = mt.mla_attention(*x, model=model, form="laga")
    torch.cuda.current_stream().wait_stream(s)
    if not torch.equal(a, c):
        raise AssertionError("laga forward on a side stream differs from the current stream's")
    print("laga forward: two calls and a side stream's call equal bit for bit")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", choices=("bfloat16", "float32"),
                    help="bfloat16 on cuda (the default there), float32 on cpu (its default)")
    a = ap.parse_args()
    want = "bfloat16" if a.device == "cuda" else "float32"  # what each device runs
    if a.dtype and a.dtype != want:
        ap.error(f"--device {a.device} runs {want}, not {a.dtype}")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torchcuda: torch sees no CUDA device", file=sys.stderr)
        return 77
    dtype = getattr(torch, want)
    model = model_at(16)  # one rank of SP 8
    torch.manual_seed(0)
    cases = [(f"{f}", lambda f=f: run_case(model, f, dtype, a.device, True)) for f in FORMS]
    cases += [("explicit non-causal", lambda: run_case(model, "explicit", dtype, a.device, False))]
    if a.device == "cuda":  # the CPU device runs no 16-bit type
        cases += [("explicit f16", lambda: run_case(model, "explicit", torch.float16, a.device, True))]
    cases += [("laga packed", lambda: packed_case(model, dtype, a.device)),
              ("streams", lambda: stream_case(model, dtype, a.device))]
    passed, failed = 0, []
    mutable = None  # a passing case's o and reference, for the mutation below
    for name, fn in cases:
        try:
            r = fn()
            if r is not None and mutable is None:
                mutable = r
            passed += 1
        except Exception as e:  # one case's failure does not hide the others'
            failed.append(name)
            print(f"{name}: FAILED: {type(e).__name__}: {e}")
    # the check can fail: one row of o moved by ten times its bound (a failure when no
    # case passed to give an o)
    if mutable is None:
        failed.append("mutation")
        print("mutation: FAILED: no case passed, so no o to move a row of")
    else:
        o, o_ref = mutable
        bad = o.double().cpu().clone()
        atol_rms, rtol, _ = bounds("explicit", 0)
        row = bad[1, -1]  # batch 1's last query row, all heads
        row += 10 * (atol_rms * o_ref.pow(2).mean().sqrt().item() + rtol * o_ref[1, -1].abs())
        try:
            check("o with one row moved", bad, o_ref, "explicit", 0)
            failed.append("mutation")
            print("mutation: FAILED: one row moved by ten bounds passed the check")
        except AssertionError:
            passed += 1
            print("mutation: one row moved by ten bounds fails the check: ok")
    # the kernels the package's plans ran and why each has its configuration (on CUDA:
    # tuned entries or template defaults, mlagen_plan_kernel)
    for key, ks in mt.kernels(model).items():
        for kname, why in ks:
            print(f"kernel {key[0]} B {key[1]} S {key[2]}: {kname}: {why}")
    total = passed + len(failed)
    print(f"torchcuda: {passed} of {total} cases passed" +
          (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
