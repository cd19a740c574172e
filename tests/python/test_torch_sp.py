"""mlagen.torch.mla_attention over a torch.distributed gloo group of P CPU processes
(torch.multiprocessing): for every form, each rank's output and input gradients equal the
single-process float64 reference's shard per element, and dw_kv_b summed over the group
equals the reference's; the same for a packed stream (cu_seqlens) with a document across
the rank boundaries and NaN in its slack rows, against each document run alone. Then a group
whose size does not divide H raises MlagenError with
the C API's message on every rank. Usage: test_torch_sp.py P, or test_torch_sp.py dead: a
peer that dies makes the op raise MlagenError (MLAGEN_EIO) instead of hanging; several
(test_torch_sp.py 2 4 dead) run one after the other from one parent."""
import os
import sys
import tempfile

from common import (FORMS, TINY, TOL, check_close, inputs, packed_reference, packed_stream,
                    reference, require)

require("torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402



def worker(rank, P, store, queue):
    import mlagen
    import mlagen.torch as mt
    from datetime import timedelta
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=P,
                                timeout=timedelta(seconds=60))
        model = mlagen.Model(TINY)
        B, S = 2, 8 * P
        Sl = S // P
        full = inputs(model, B, S, torch.float64, seed=5)
        o_ref = reference(*full, model.softmax_scale)
        d_o = torch.randn(o_ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
        ref_g = torch.autograd.grad(o_ref, full, d_o)
        for form in FORMS:
            sl = mlagen.token_positions(form, S, P, rank)  # laga-cp: two chunks
            assert len(sl) == Sl
            x = [t.detach()[:, sl].clone().requires_grad_() for t in full[:3]]
            x.append(full[3].detach().clone().requires_grad_())
            o = mt.mla_attention(*x, model=model, form=form, sp_group=dist.group.WORLD)
            g = list(torch.autograd.grad(o, x, d_o[:, sl]))
            dist.all_reduce(g[3])  # the trainer's gradient reduction over the group
            check_close(f"rank {rank} {form} o", o, o_ref[:, sl], TOL["float64"])
            for n, got, r in zip(("dq", "dc_kv", "dk_rope"), g[:3], ref_g[:3]):
                check_close(f"rank {rank} {form} {n}", got, r[:, sl], TOL["float64"])
            check_close(f"rank {rank} {form} dw_kv_b (summed)", g[3], ref_g[3], TOL["float64"])
            if rank == 0:
                print(f"P={P} {form}: o and all gradients match the reference", flush=True)
        # packed: T_cap = 8 P rows, document 1 (rows 3 .. 3 + 5 P) across rank boundaries
        # (and laga-cp's chunks), an empty one, NaN in the slack rows
        q, c, k, w, d_o, cu = packed_stream(model, [3, 5 * P, 0, 2], 8 * P, seed=9)
        for causal in (True, False):
            o_ref, g_ref = packed_reference(q, c, k, w, cu, model.softmax_scale, causal, d_o)
            for form in FORMS:
                sl = mlagen.token_positions(form, 8 * P, P, rank)
                x = [t[sl].clone().requires_grad_() for t in (q, c, k)]
                x.append(w.clone().requires_grad_())
                o = mt.mla_attention(*x, model=model, form=form, causal=causal,
                                     sp_group=dist.group.WORLD, cu_seqlens=torch.tensor(cu))
                g = list(torch.autograd.grad(o, x, d_o[sl]))
                dist.all_reduce(g[3])
                what = f"rank {rank} packed {form} causal={causal}"
                # relative to the whole stream's max|ref|: a rank's rows of a document hold
                # sums over the other ranks' rows too (P = 4, shard's max: up to 3.5e-15)
                for n, got, r in zip(("o", "dq", "dc_kv", "dk_rope"), (o, *g[:3]),
                                     (o_ref, *g_ref[:3])):
                    check_close(f"{what} {n}", got, r[sl], TOL["float64"],
                                scale=r.abs().max().item())
                check_close(f"{what} dw_kv_b (summed)", g[3], g_ref[3], TOL["float64"])
            if rank == 0:
                print(f"P={P} packed causal={causal}: every form matches the documents "
                      "run alone", flush=True)
        # a module with the group: a deepcopy shares the group and computes the same o (its
        # own plans); pickling it raises TypeError (a process group is not serializable)
        import copy
        import io
        core = mt.MLACoreAttention(model, form="laga", sp_group=dist.group.WORLD)
        sl = mlagen.token_positions("laga", S, P, rank)
        x = [t.detach()[:, sl] for t in full[:3]] + [full[3].detach()]
        twin = copy.deepcopy(core)
        assert twin.sp_group is core.sp_group and twin._plans is not core._plans
        assert torch.equal(twin(*x), core(*x))
        shallow = copy.copy(core)  # shares the group and the plans
        assert shallow.sp_group is core.sp_group and shallow._plans is core._plans
        assert torch.equal(shallow(*x), core(*x))
        try:
            torch.save(core, io.BytesIO())
            raise AssertionError("a module with a group was pickled")
        except TypeError as e:
            assert "sp_group" in str(e), str(e)
        if rank == 0:
            print(f"P={P} MLACoreAttention with its group: deepcopy shares it, pickling refused",
                  flush=True)
        # H = 2 heads cannot be split over P = 4 ranks (or 3 heads over 2)
        bad = mlagen.Model(dict(TINY, num_attention_heads=2 if P > 2 else 3))
        x = [t.detach() for t in inputs(bad, 1, 4, torch.float64)]
        try:
            mt.mla_attention(*x, model=bad, sp_group=dist.group.WORLD)
            raise AssertionError("no error for a group that does not divide H")
        except mlagen.MlagenError as e:
            assert "MLAGEN_EINVAL" in str(e) and "sp_size" in str(e), str(e)
            if rank == 0:
                print(f"P={P} bad group: {e}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
        queue.put((rank, None))
    except BaseException as e:  # report to the parent instead of hanging it
        import traceback
        queue.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def dead_peer(rank, P, store, queue):
    """Rank 1 dies after joining the group; rank 0's op must raise MlagenError (MLAGEN_EIO,
    naming the callback and the plan step, chained to gloo's error) instead of hanging."""
    import mlagen
    import mlagen.torch as mt
    from datetime import timedelta
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=P,
                                timeout=timedelta(seconds=30))
        dist.barrier()  # the connections exist
        if rank == 1:
            queue.put((rank, None))
            queue.close()
            queue.join_thread()  # flushed before dying
            os._exit(0)
        model = mlagen.Model(TINY)
        x = [t.detach() for t in inputs(model, 1, 8, torch.float64)]
        try:
            mt.mla_attention(*x, model=model, form="laga", sp_group=dist.group.WORLD)
            raise AssertionError("no error although rank 1 died")
        except mlagen.MlagenError as e:
            msg = str(e)
            assert "MLAGEN_EIO" in msg and "callback returned" in msg and "plan step" in msg, msg
            assert e.__cause__ is not None, "not chained to the collective's exception"
            print(f"dead peer: {msg[:300]}", flush=True)
        queue.put((rank, None))
        queue.close()
        queue.join_thread()
        os._exit(0)  # the group cannot be torn down cleanly without its peer
    except BaseException as e:
        import traceback
        queue.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run(arg):
    """The group of arg (P, or dead): the list of (rank, error) of the ranks that failed."""
    dead = arg == "dead"
    P = 2 if dead else int(arg)
    # fork, not spawn: the parent has only imported torch (one thread, no thread pool, no
    # process group), so each rank starts from it instead of importing torch again (about
    # 3.6 s of CPU per rank, most of this test's time); mlagen is imported in the rank
    threads = len(os.listdir("/proc/self/task"))
    assert threads == 1, f"fork from a parent with {threads} threads"
    ctx = tmp.get_context("fork")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        target = dead_peer if dead else worker
        procs = [ctx.Process(target=target, args=(r, P, store, queue)) for r in range(P)]
        for p in procs:
            p.start()
        results = []
        try:
            for _ in range(P):  # a rank that died without reporting: no hang, a failure
                results.append(queue.get(timeout=120))
        except Exception as e:
            results.append((-1, f"no report from every rank in 120 s ({type(e).__name__})"))
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return [(r, e) for r, e in results if e]


def main():
    failed = []
    for arg in sys.argv[1:]:
        failed += [(f"{arg}: rank {r}", e) for r, e in run(arg)]
    for r, e in failed:
        print(f"{r} failed: {e}", file=sys.stderr)
    if failed:
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
