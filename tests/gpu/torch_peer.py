#!/usr/bin/env python3
"""torch_peer.py: the peers mlagen's attention kernels are compared with, timed like
tests/gpu/bench.c (CUDA events, warm-up, median, input sets rotated so inputs are not
L2-hot).

    python3 tests/gpu/torch_peer.py OUTDIR [--seqs 1024,4096,8192,16384] [--heads 16,128]
                                    [--iters 20] [--warmup 3] [--sets 4] [--row-budget-ms 4000]

    --causal 1,0 (both masks; default 1) --peers sdpa_cudnn (comma list; default all)
    --ops fwd,fwd_bwd (the default): the explicit-form rows (run.sh's sm90peers step)

Shapes: B = 1, bf16, causal (and with --causal 0 not: pairs S^2), q and k [B, H, S, 192], v [B, H, S, 128] (DeepSeek-V3:
d_qk = d_n + d_r = 128 + 64, d_v = 128), softmax scale 0.13523 (V3's, mscale^2/sqrt(192)).
Peers, each when it works on this shape (a failure is a row with its message, never an
exit):
  sdpa_<backend>  torch.nn.functional.scaled_dot_product_attention, one row per backend
                  forced through torch.nn.attention.sdpa_kernel (cudnn, efficient, flash),
                  and sdpa_default (PyTorch's own choice)
  flash_attn      flash_attn.flash_attn_func (FlashAttention-2) on [B, S, H, D]; if it refuses
                  d_v != d_qk, flash_attn_vpad: v zero-padded to 192, output sliced
  flash_attn3     flash_attn_interface.flash_attn_func (FlashAttention-3), when importable
Absorbed form (MQA over the latent, the peers of mlagen's mqa_* rows): q [B, H, S, 576],
one shared latent head c [B, 1, S, 576] (d_qk = d_c + d_r = 512 + 64) serving as the keys
and, through its first 512 columns, as the values (d_v = d_c = 512), at --mqa-seqs x
--mqa-heads (default 1024,4096 x --heads: the peers are slower here, and the math backend
materializes [H, S, S]); gradients of q and c (k and v both come from c):
  mqa_sdpa_<backend>  scaled_dot_product_attention with enable_gqa=True (the single head
                  broadcast to the H query heads), or, where the installed torch lacks
                  enable_gqa or the backend refuses it, k and v expanded to H heads (a
                  view, noted in the row): default, cudnn, efficient, flash, math
                  (most backends refuse head dim 576: those rows say so)
Ops: fwd (forward only, no autograd) and fwd_bwd (forward, then torch.autograd.grad of
q, k, v given dO). FLOPs as MLA.md: forward 2 H pairs (d_qk + d_v), backward 2 H pairs
(3 d_qk + 2 d_v), pairs = S (S + 1) / 2. A row whose first warm-up call is slow gets fewer
iterations (at least 5) to stay within --row-budget-ms.

Writes OUTDIR/torch.csv and OUTDIR/torch.log. Exit 0 when the table was written (even with
every peer unsupported), 1 when torch or CUDA is unavailable, 2 on usage errors.
"""
import argparse
import math
import os
import sys
import time

DQK, DV = 192, 128
SCALE = 1.3689 * 1.3689 / math.sqrt(DQK)
MQK, MV = 576, 512  # the absorbed form: d_c + d_r, d_c (same softmax scale)

LOG = None


def say(msg=""):
    print(msg, flush=True)
    if LOG:
        LOG.write(msg + "\n")
        LOG.flush()


def parse_list(s):
    return [int(x) for x in s.split(",") if x]


def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--seqs", default="1024,4096,8192,16384")
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("--row-budget-ms", type=float, default=4000.0)
    ap.add_argument("--mqa-seqs", default="1024,4096", help="absorbed-form peers' S ('' for none)")
    ap.add_argument("--mqa-heads", default=None, help="absorbed-form peers' H (default: --heads)")
    ap.add_argument("--causal", default="1", help="explicit-form masks: 1 causal, 0 none, 1,0 both")
    ap.add_argument("--peers", default="", help="explicit-form peers to time (comma list; '' all)")
    ap.add_argument("--ops", default="fwd,fwd_bwd", help="explicit-form ops: fwd, fwd_bwd")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    LOG = open(os.path.join(a.outdir, "torch.log"), "w")
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        say(f"torch_peer: cannot import torch: {e}")
        return 1
    if not torch.cuda.is_available():
        say("torch_peer: torch.cuda.is_available() is False")
        return 1
    dev = torch.device("cuda")
    say(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
        f"device {torch.cuda.get_device_name(0)}")

    peers = []  # (name, layout "bhsd"|"bshd", fwd(q, k, v) -> o)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = [("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                    ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                    ("sdpa_flash", SDPBackend.FLASH_ATTENTION)]
    except Exception as e:  # noqa: BLE001
        say(f"torch.nn.attention.sdpa_kernel unavailable ({e}): default SDPA only")
        backends = []

    def sdpa_default(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=SCALE)

    peers.append(("sdpa_default", "bhsd", sdpa_default))
    for name, be in backends:
        def fn(q, k, v, causal, be=be):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=SCALE)
        peers.append((name, "bhsd", fn))
    try:
        import flash_attn
        from flash_attn import flash_attn_func as fa2
        say(f"flash_attn {getattr(flash_attn, '__version__', '?')}")

        def fa2_fn(q, k, v, causal):
            return fa2(q, k, v, causal=causal, softmax_scale=SCALE)

        def fa2_vpad(q, k, v, causal):
            vp = F.pad(v, (0, DQK - DV))
            return fa2(q, k, vp, causal=causal, softmax_scale=SCALE)[..., :DV]
        peers.append(("flash_attn", "bshd", fa2_fn))
        peers.append(("flash_attn_vpad", "bshd", fa2_vpad))
    except Exception as e:  # noqa: BLE001
        say(f"flash_attn not importable ({type(e).__name__}: {e}): skipped")
    try:
        from flash_attn_interface import flash_attn_func as fa3

        def fa3_fn(q, k, v, causal):
            o = fa3(q, k, v, causal=causal, softmax_scale=SCALE)
            return o[0] if isinstance(o, tuple) else o
        peers.append(("flash_attn3", "bshd", fa3_fn))
        say("flash_attn_interface (FlashAttention-3) importable")
    except Exception as e:  # noqa: BLE001
        say(f"flash_attn_interface not importable ({type(e).__name__}): skipped")

    if a.peers:
        keep = a.peers.split(",")
        peers = [p for p in peers if p[0] in keep]
    ops = [o for o in a.ops.split(",") if o]
    masks = [bool(int(c)) for c in a.causal.split(",") if c]
    rows = []
    start = [torch.cuda.Event(enable_timing=True) for _ in range(257)]

    def time_row(label, fn, n_sets):
        """Warm-up, then iters calls, each between two events; median ms, iterations."""
        w_ms = 0.0
        for i in range(max(a.warmup, 1)):
            start[0].record()
            fn(i % n_sets)
            start[1].record()
            start[1].synchronize()
            w_ms = start[0].elapsed_time(start[1])
        n = a.iters
        if w_ms > 0 and n * w_ms > a.row_budget_ms:
            n = min(a.iters, max(5, int(a.row_budget_ms / w_ms)))
            say(f"  ({label}: {w_ms:.1f} ms per call, {n} iterations instead of {a.iters})")
        n = min(n, 256)
        start[0].record()
        for i in range(n):
            fn((i + 1) % n_sets)
            start[i + 1].record()
        start[n].synchronize()
        t = sorted(start[i].elapsed_time(start[i + 1]) for i in range(n))
        med = t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2])
        return med, n

    say(f"B=1 bf16 {'causal' if masks == [True] else 'causal ' + a.causal} d_qk={DQK} d_v={DV} scale={SCALE:.5f}; warm-up {a.warmup}, "
        f"median of {a.iters}, {a.sets} input sets")
    hdr = f"{'impl':<16} {'op':<8} {'H':>4} {'S':>6} {'causal':>6} {'ms(median)':>10} {'TFLOP/s':>8} {'iters':>5}  note"
    say(hdr)
    for H in parse_list(a.heads):
        for S in parse_list(a.seqs):
            per_set = 2 * (2 * H * S * DQK + 2 * H * S * DV)
            free, _ = torch.cuda.mem_get_info()
            n_sets = a.sets
            while n_sets > 1 and n_sets * per_set > 0.5 * free:
                n_sets -= 1
            g = torch.Generator(device=dev)
            g.manual_seed(1234 + S + H)
            base = []
            for _ in range(n_sets):
                mk = lambda d: torch.randn(1, H, S, d, device=dev, dtype=torch.bfloat16, generator=g)  # noqa: E731
                base.append((mk(DQK), mk(DQK), mk(DV), mk(DV)))
            for name, layout, fwd in peers:
                if layout == "bhsd":
                    sets = base
                else:  # [B, S, H, D], contiguous
                    sets = [tuple(x.transpose(1, 2).contiguous() for x in s) for s in base]
                for causal, op in [(c, o) for c in masks for o in ops]:
                    pairs = S * (S + 1) / 2 if causal else S * S
                    f_fwd = 2 * H * pairs * (DQK + DV)
                    f_bwd = 2 * H * pairs * (3 * DQK + 2 * DV)
                    note = ""
                    try:
                        if op == "fwd":
                            def call(i, sets=sets, fwd=fwd, causal=causal):
                                q, k, v, _ = sets[i]
                                with torch.no_grad():
                                    fwd(q, k, v, causal)
                        else:
                            leaf = [tuple(x.detach().requires_grad_(j < 3) for j, x in enumerate(s))
                                    for s in sets]

                            def call(i, leaf=leaf, fwd=fwd, causal=causal):
                                q, k, v, do = leaf[i]
                                o = fwd(q, k, v, causal)
                                torch.autograd.grad(o, (q, k, v), do)
                        ms, iters = time_row(f"{name} {op} H={H} S={S} causal={int(causal)}", call, n_sets)
                        flops = f_fwd if op == "fwd" else f_fwd + f_bwd
                        tf = flops / (ms * 1e-3) / 1e12
                    except Exception as e:  # noqa: BLE001
                        ms, iters, tf = float("nan"), 0, float("nan")
                        note = f"unsupported: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                        torch.cuda.synchronize()
                    if name == "flash_attn_vpad":
                        note = (note + " " if note else "") + "v padded to 192 (extra work)"
                    rows.append([name, op, H, S, ms, tf, iters, note, int(causal)])
                    say(f"{name:<16} {op:<8} {H:>4} {S:>6} {int(causal):>6} {ms:>10.3f} {tf:>8.1f} {iters:>5}  {note}")
                if layout != "bhsd":
                    del sets
            del base
            torch.cuda.empty_cache()
    for r in rows:
        r[8:8] = [DQK, DV]  # ..., note, d_qk, d_v, causal

    # the absorbed form: MQA over the latent, one shared head as keys and values
    mqa_rows = []
    mqa_seqs = parse_list(a.mqa_seqs) if a.mqa_seqs else []
    mqa_heads = parse_list(a.mqa_heads if a.mqa_heads is not None else a.heads)
    if mqa_seqs:
        import warnings  # the efficient backend warns when it refuses enable_gqa; the row notes it
        warnings.filterwarnings("ignore", message=".*require query, key and value to have the same num_heads.*")
        say(f"\nabsorbed form (MQA over the latent): d_qk={MQK} d_v={MV}, one shared K/V head")
        say(hdr)
    mqa_backends = [("mqa_sdpa_default", None)] + [("mqa_" + n, be) for n, be in backends]
    try:
        mqa_backends.append(("mqa_sdpa_math", SDPBackend.MATH))
    except Exception:  # noqa: BLE001
        pass

    def mqa_attn(q, c, be, gqa):
        k, v = c, c[..., :MV]
        if not gqa:
            H = q.shape[1]
            k, v = k.expand(-1, H, -1, -1), v.expand(-1, H, -1, -1)
        kw = {"enable_gqa": True} if gqa else {}
        if be is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE, **kw)
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE, **kw)

    for H in mqa_heads:
        for S in mqa_seqs:
            pairs = S * (S + 1) / 2
            f_fwd = 2 * H * pairs * (MQK + MV)
            f_bwd = 2 * H * pairs * (3 * MQK + 2 * MV)
            per_set = 2 * (H * S * MQK + S * MQK + 2 * H * S * MV)
            free, _ = torch.cuda.mem_get_info()
            n_sets = a.sets
            while n_sets > 1 and n_sets * per_set > 0.3 * free:
                n_sets -= 1
            g = torch.Generator(device=dev)
            g.manual_seed(4321 + S + H)
            mk = lambda *shape: torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=g)  # noqa: E731
            sets = [(mk(1, H, S, MQK), mk(1, 1, S, MQK), mk(1, H, S, MV)) for _ in range(n_sets)]
            for name, be in mqa_backends:
                for op in ("fwd", "fwd_bwd"):
                    gqa, note, first = True, "", ""
                    ms, iters, tf = float("nan"), 0, float("nan")
                    for attempt in range(2):
                        try:
                            if op == "fwd":
                                def call(i, be=be, gqa=gqa):
                                    q, c, _ = sets[i]
                                    with torch.no_grad():
                                        mqa_attn(q, c, be, gqa)
                            else:
                                leaf = [(q.detach().requires_grad_(True), c.detach().requires_grad_(True), do)
                                        for q, c, do in sets]

                                def call(i, be=be, gqa=gqa, leaf=leaf):
                                    q, c, do = leaf[i]
                                    o = mqa_attn(q, c, be, gqa)
                                    torch.autograd.grad(o, (q, c), do)
                            ms, iters = time_row(f"{name} {op} H={H} S={S}", call, n_sets)
                            flops = f_fwd if op == "fwd" else f_fwd + f_bwd
                            tf = flops / (ms * 1e-3) / 1e12
                            note = "" if gqa else "k, v expanded to H heads (enable_gqa refused)"
                            break
                        except Exception as e:  # noqa: BLE001
                            torch.cuda.synchronize()
                            msg = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                            if gqa and attempt == 0:
                                gqa = False  # retry with the head expanded
                                first = msg
                                continue
                            ms, iters, tf = float("nan"), 0, float("nan")
                            note = f"unsupported: {msg}" + (f" (with enable_gqa: {first})" if first and first != msg else "")
                    mqa_rows.append([name, op, H, S, ms, tf, iters, note, MQK, MV, 1])
                    say(f"{name:<16} {op:<8} {H:>4} {S:>6} {1:>6} {ms:>10.3f} {tf:>8.1f} {iters:>5}  {note}")
            del sets
            torch.cuda.empty_cache()
    rows.extend(mqa_rows)

    path = os.path.join(a.outdir, "torch.csv")
    with open(path, "w") as f:
        f.write("tool,impl,op,H,S,d_qk,d_v,causal,ms,tflops,iters,note\n")
        for name, op, H, S, ms, tf, iters, note, dqk, dv, causal in rows:
            ms_s = "" if math.isnan(ms) else f"{ms:.4f}"
            tf_s = "" if math.isnan(tf) else f"{tf:.2f}"
            f.write(f"torch,{name},{op},{H},{S},{dqk},{dv},{causal},{ms_s},{tf_s},{iters},\"{note.replace(chr(34), chr(39))}\"\n")
    say(f"wrote {path}")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"torch_peer: {time.time() - t0:.1f} s, exit {rc}")
    sys.exit(rc)
