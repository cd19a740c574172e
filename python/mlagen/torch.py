"""mlagen's MLA attention as a differentiable PyTorch op (see docs/torch.md).

    o = mla_attention(q, c_kv, k_rope, w_kv_b, model=model, form="laga", sp_group=group)

Tensors are the C API's op boundary for this rank's sequence shard:
    q       [B, S_l, H, d_n + d_r]  RoPE part last
    c_kv    [B, S_l, d_c]           the KV latent (after kv_a_layernorm)
    k_rope  [B, S_l, d_r]           RoPE applied, shared by the heads
    w_kv_b  [H (d_n + d_v), d_c]    HF's kv_b_proj.weight
    o       [B, S_l, H, d_v]        before o_proj
S_l = S / P with P the size of sp_group (1 without one). Packed sequences (cu_seqlens, the
THD layout: docs/packed.md) drop the batch dim: q [T_l, H, d_n + d_r], c_kv [T_l, d_c],
k_rope [T_l, d_r], o [T_l, H, d_v], T_l = T_cap / P. CPU tensors (float32, float64) run
on the CPU device of the C API; CUDA tensors (bfloat16, float16) run the CUDA executor on
the current stream. Errors of the C API raise mlagen.MlagenError with its message.
"""
import copy
import ctypes
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from . import _OWNERS, Model, _capi, _Owner
from ._capi import MlagenError

__all__ = ["mla_attention", "MLACoreAttention", "MlagenError", "kernels"]

_DTYPE_CODE = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16,
               torch.float32: _capi.DTYPE_F32, torch.float64: _capi.DTYPE_F64}
_TORCH_DTYPE = {v: k for k, v in _DTYPE_CODE.items()}


class _GroupComm:
    """The C API's collective callbacks (mlagen_comm_ops) over a torch.distributed group.

    Host buffers (CPU plans) are wrapped as CPU tensors, device buffers (CUDA plans) as
    CUDA tensors on the call's stream. A collective that raises (a dead peer: gloo's and
    NCCL's timeout is the group's) is kept in .error and reported to the C API as a
    nonzero return, which stops the pass with MLAGEN_EIO; the op re-raises it."""

    def __init__(self, group, device_kind):
        self.group, self.cuda = group, device_kind == _capi.DEVICE_CUDA
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.error = None
        self._fns = [_capi.COLLECTIVE(self._wrap(f))
                     for f in (self._all_to_all, self._all_gather, self._reduce_scatter)]
        self.ops = _capi.CommOps(self.size, self.rank, None, *self._fns)

    def _wrap(self, fn):
        def cb(user, send, recv, count, dtype, stream):
            try:
                t = _TORCH_DTYPE[dtype]
                if self.cuda:
                    with torch.cuda.stream(torch.cuda.ExternalStream(stream or 0)):
                        fn(send, recv, count, t)
                else:
                    fn(send, recv, count, t)
                return 0
            except BaseException as e:  # never let an exception cross the C frames
                self.error = e
                return 1
        return cb

    def _view(self, ptr, n, dtype):
        """n elements of dtype at ptr, as a tensor sharing the memory."""
        esize = torch.empty((), dtype=dtype).element_size()
        if self.cuda:
            itype = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}[esize]
            holder = type("_Cai", (), {})()
            holder.__cuda_array_interface__ = {"shape": (n,), "typestr": itype,
                                               "data": (ptr, False), "version": 2}
            return torch.as_tensor(holder, device="cuda").view(dtype)
        return torch.frombuffer((ctypes.c_char * (n * esize)).from_address(ptr), dtype=dtype)

    def _all_to_all(self, send, recv, count, t):
        n = self.size * count
        dist.all_to_all_single(self._view(recv, n, t), self._view(send, n, t), group=self.group)

    def _all_gather(self, send, recv, count, t):
        out = self._view(recv, self.size * count, t).view(self.size, count)
        dist.all_gather(list(out.unbind(0)), self._view(send, count, t), group=self.group)

    def _reduce_scatter(self, send, recv, count, t):
        # every rank's block for this rank, then their sum in rank order (f32 for 16-bit
        # types, rounded once), so the result does not depend on the backend's reduction
        src = self._view(send, self.size * count, t)
        blocks = torch.empty_like(src)
        dist.all_to_all_single(blocks, src, group=self.group)
        acc = torch.float32 if t in (torch.bfloat16, torch.float16) else t
        self._view(recv, count, t).copy_(blocks.view(self.size, count).to(acc).sum(0))


class _Plan:
    """One mlagen_plan (one form, B, S, dtype, device, rank of the group, varlen or not)
    and its sizes."""

    def __init__(self, model, form, batch, seq, rank, size, causal, dtype, head_groups,
                 device_kind, group, varlen):
        L = _capi.lib()
        self.model, self.ctx = model, model._ctx  # keep the context alive
        if form not in _capi.FORMS:
            raise ValueError(f"mla_attention: form = {form!r}; one of "
                             f"{', '.join(_capi.FORMS)}")
        for name, v in (("batch", batch), ("sp_rank", rank), ("sp_size", size),
                        ("head_groups", head_groups)):
            _capi.check_c_int(f"mla_attention: {name}", v)
        desc = _capi.PlanDesc(_capi.FORMS[form], batch, seq, rank, size, int(bool(causal)),
                              _DTYPE_CODE.get(dtype, 0), head_groups, device_kind,
                              int(bool(varlen)))
        h = ctypes.c_void_p()
        _capi.check(L.mlagen_plan_create(self.ctx.handle, model._handle, ctypes.byref(desc),
                                         ctypes.byref(h)), self.ctx.handle)
        self.handle, self._destroy = h, L.mlagen_plan_destroy
        self.sizes = _capi.Sizes()
        _capi.check(L.mlagen_plan_sizes(h, ctypes.byref(self.sizes)), self.ctx.handle)
        self.comm = None
        if size > 1:
            self.comm = _GroupComm(group, device_kind)
            _capi.check(L.mlagen_plan_set_comm_ops(h, ctypes.byref(self.comm.ops)),
                        self.ctx.handle)
            if device_kind == _capi.DEVICE_CUDA:
                # return once the pass is queued, as torch's own NCCL collectives do (the
                # group's watchdog and timeout catch a dead peer): the C API's default
                # waits for the pass on the host at every call
                _capi.check(L.mlagen_plan_set_comm_wait(h, 0.0), self.ctx.handle)

    def __del__(self):
        if getattr(self, "handle", None):
            self._destroy(self.handle)
            self.handle = None

    def info(self, field):
        return getattr(self.sizes, field)

    def kernels(self):
        """[(kernel name, its configuration and why)] as mlagen_plan_kernel reports them:
        empty before the plan's first pass and for a CPU plan."""
        L, n = _capi.lib(), ctypes.c_int(0)
        _capi.check(L.mlagen_plan_kernel(self.handle, 0, ctypes.byref(n), None, None),
                    self.ctx.handle)
        out = []
        for i in range(n.value):
            name, cfg = ctypes.c_char_p(), ctypes.c_char_p()
            _capi.check(L.mlagen_plan_kernel(self.handle, i, None, ctypes.byref(name),
                                             ctypes.byref(cfg)), self.ctx.handle)
            out.append((name.value.decode(), cfg.value.decode()))
        return out

    def empty(self, field, device):
        i = self.info(field)
        return torch.empty(tuple(i.dims[:i.ndim]), dtype=_TORCH_DTYPE[i.dtype], device=device)

    def run(self, backward, tensors, workspace, saved, cu=None):
        """One pass; cu: the documents of a varlen plan as a host int32 tensor (_host_cu)."""
        L = _capi.lib()
        ts = _capi.Tensors()
        if cu is not None:
            n = cu.numel()  # 0: the C API's "needs at least one entry", not a NULL pointer
            buf = cu if n else torch.zeros(1, dtype=torch.int32)
            ts.cu_seqlens = ctypes.cast(buf.data_ptr(), ctypes.POINTER(ctypes.c_int32))
            ts.n_cu_seqlens = n
        for name, t in tensors.items():
            c = getattr(ts, name)
            c.data = t.data_ptr() or None
            c.dtype = _DTYPE_CODE.get(t.dtype, 0)
            c.ndim = t.dim()
            for k, d in enumerate(t.shape[:_capi.MAX_DIMS]):
                c.dims[k] = d
        stream = None
        if workspace.is_cuda:
            stream = torch.cuda.current_stream(workspace.device).cuda_stream
        fn = L.mlagen_backward if backward else L.mlagen_forward
        if self.comm:
            self.comm.error = None
        rc = fn(self.handle, ctypes.byref(ts), workspace.data_ptr() or None, workspace.numel(),
                saved.data_ptr() or None, saved.numel(), stream)
        if rc:
            err = self.comm.error if self.comm else None
            try:
                _capi.check(rc, self.ctx.handle)
            except MlagenError as e:
                if err is not None:
                    raise MlagenError(e.status, e.status_name,
                                      f"{e.message}: {type(err).__name__}: {err}") from err
                raise


def _area(nbytes, device):
    """A caller area of nbytes (16-byte aligned: torch's allocators align to 64 or more)."""
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)


def _owner_of(model):
    """The model's owner (mlagen._Owner, made with the Model): its plans in model.plans."""
    return model._owner


def kernels(model):
    """The generated kernels each cached plan of model (an mlagen.Model: the plans of
    mla_attention calls given it; or an MLACoreAttention: the module's own plans, not its
    model's) runs, with the configuration of each and why
    (mlagen_plan_kernel): {(form, B, S, dtype, device, ...): [(kernel, configuration), ...]}.
    A plan's list is empty until its first pass, and for CPU tensors (no generated kernel).
    For a trainer to log which tuned configurations are in use (docs/tuning.md)."""
    plans = model._plans if isinstance(model, MLACoreAttention) else model.plans
    return {key: plan.kernels() for key, plan in plans.items()}


def _group_of(sp_group):
    if sp_group is None:
        return 1, 0
    if not dist.is_initialized():
        raise ValueError("mla_attention: sp_group given but torch.distributed is not "
                         "initialized (init_process_group)")
    return dist.get_world_size(sp_group), dist.get_rank(sp_group)


def _plan(owner, form, q, causal, head_groups, group_name, varlen):
    """The cached plan of (form, B, S, dtype, device, group, causal, head_groups, varlen);
    a varlen plan (q [T_l, H, d_n + d_r]) has B = 1 and S = T_cap = T_l P, whatever the
    documents: one plan serves every cu_seqlens of its capacity."""
    o = _OWNERS[owner]
    sp_group = dist.distributed_c10d._resolve_process_group(group_name) if group_name else None
    P, rank = _group_of(sp_group)
    # plans are shape-specialized: under torch.compile's dynamic shapes int() specializes
    if varlen:
        B, S = 1, int(q.shape[0]) * P
    else:
        B, S = int(q.shape[0]), int(q.shape[1]) * P
    key = (form, B, S, q.dtype, q.device, group_name, P, rank, bool(causal), head_groups,
           bool(varlen))
    plan = o.plans.get(key)
    if plan is None:
        kind = _capi.DEVICE_CUDA if q.device.type == "cuda" else _capi.DEVICE_CPU
        plan = _Plan(o.model, form, B, S, rank, P, causal, q.dtype, head_groups, kind, sp_group,
                     varlen)
        o.plans[key] = plan
    return plan


def _host_cu(cu_seqlens):
    """The boundaries as a contiguous host int32 tensor: read to the host once (a CUDA
    tensor is copied, which waits for its stream). int64 values beyond int32 raise
    ValueError naming the index (converting would wrap them); the C API checks the rest."""
    c = cu_seqlens.detach().to("cpu")
    if c.dtype == torch.int64:
        big = (c < _capi.INT_MIN) | (c > _capi.INT_MAX)
        if bool(big.any()):
            i = int(big.nonzero()[0, 0])
            raise ValueError(f"mla_attention: cu_seqlens[{i}] = {int(c[i])} does not fit int32")
    return c.to(torch.int32).contiguous()


# The op as two torch.library custom ops (forward: o and the saved area; backward: the four
# gradients) with fake implementations from the plan's sizes, so torch.compile keeps them
# in its graph, and autograd joining them.
@torch.library.custom_op("mlagen::mla_attention_fwd", mutates_args=())
def _fwd(q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, w_kv_b: torch.Tensor,
         owner: int, form: str, causal: bool, head_groups: int, group: str,
         cu_seqlens: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    plan = _plan(owner, form, q, causal, head_groups, group, cu_seqlens is not None)
    cu = None if cu_seqlens is None else _host_cu(cu_seqlens)
    q, c_kv, k_rope, w_kv_b = (t.contiguous() for t in (q, c_kv, k_rope, w_kv_b))
    o = plan.empty("o", q.device)
    saved = _area(plan.sizes.saved_bytes, q.device)
    ws = _area(plan.sizes.workspace_bytes, q.device)
    plan.run(False, dict(q=q, c_kv=c_kv, k_rope=k_rope, w_kv_b=w_kv_b, o=o), ws, saved, cu)
    return o, saved


@_fwd.register_fake
def _fwd_fake(q, c_kv, k_rope, w_kv_b, owner, form, causal, head_groups, group,
              cu_seqlens=None):
    plan = _plan(owner, form, q, causal, head_groups, group, cu_seqlens is not None)
    i = plan.info("o")
    return (q.new_empty(tuple(i.dims[:i.ndim]), dtype=_TORCH_DTYPE[i.dtype]),
            q.new_empty(max(plan.sizes.saved_bytes, 1), dtype=torch.uint8))


@torch.library.custom_op("mlagen::mla_attention_bwd", mutates_args=())
def _bwd(d_o: torch.Tensor, q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
         w_kv_b: torch.Tensor, o: torch.Tensor, saved: torch.Tensor, owner: int, form: str,
         causal: bool, head_groups: int, group: str, cu_seqlens: Optional[torch.Tensor] = None
         ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = _plan(owner, form, q, causal, head_groups, group, cu_seqlens is not None)
    cu = None if cu_seqlens is None else _host_cu(cu_seqlens)
    q, c_kv, k_rope, w_kv_b, o = (t.contiguous() for t in (q, c_kv, k_rope, w_kv_b, o))
    d_o = d_o.contiguous().to(o.dtype)
    g = {f: plan.empty(f, q.device) for f in ("dq", "dc_kv", "dk_rope", "dw_kv_b")}
    ws = _area(plan.sizes.workspace_bytes, q.device)
    plan.run(True, dict(q=q, c_kv=c_kv, k_rope=k_rope, w_kv_b=w_kv_b, o=o, d_o=d_o, **g), ws,
             saved, cu)
    return g["dq"], g["dc_kv"], g["dk_rope"], g["dw_kv_b"].to(w_kv_b.dtype)


@_bwd.register_fake
def _bwd_fake(d_o, q, c_kv, k_rope, w_kv_b, o, saved, owner, form, causal, head_groups, group,
              cu_seqlens=None):
    return (torch.empty_like(q), torch.empty_like(c_kv), torch.empty_like(k_rope),
            torch.empty_like(w_kv_b))


def _setup_context(ctx, inputs, output):
    q, c_kv, k_rope, w_kv_b = inputs[:4]
    cu = inputs[9] if len(inputs) > 9 else None
    ctx.save_for_backward(q, c_kv, k_rope, w_kv_b, *output, cu)
    ctx.args, ctx.n_inputs = inputs[4:9], len(inputs)
    ctx.owner = _OWNERS[inputs[4]]  # keeps the model and its plans alive until backward


def _backward(ctx, d_o, d_saved):
    q, c_kv, k_rope, w_kv_b, o, saved, cu = ctx.saved_tensors
    grads = _bwd(d_o, q, c_kv, k_rope, w_kv_b, o, saved, *ctx.args, cu)
    return (*grads, *[None] * (ctx.n_inputs - 4))


_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(tensors, cu_seqlens, fn):
    """The four inputs are tensors on one device, cpu or cuda, q at least 2-d; cu_seqlens
    None or a 1-D int32/int64 tensor on cpu or cuda (its values: _host_cu, the C API)."""
    q = tensors[0]
    for name, t in zip(("q", "c_kv", "k_rope", "w_kv_b"), tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} is a {type(t).__name__}, not a tensor")
        if t.device != q.device:
            raise ValueError(f"{fn}: {name} is on {t.device}, q on {q.device}: all four "
                             "tensors must be on one device")
        if t.dtype not in _DTYPE_CODE:
            raise ValueError(f"{fn}: {name} is {t.dtype}: mlagen takes float32 and float64 "
                             "(cpu), bfloat16 and float16 (cuda)")
    if cu_seqlens is None and q.dim() != 4:
        raise ValueError(f"{fn}: q must be a tensor [B, S_l, H, d_n + d_r] (or, with "
                         f"cu_seqlens, [T_l, H, d_n + d_r]), got {tuple(q.shape)}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{fn}: tensors on {q.device}: mlagen runs on cpu and cuda")
    if cu_seqlens is None:
        return
    if q.dim() != 3:
        raise ValueError(f"{fn}: with cu_seqlens q must be a tensor [T_l, H, d_n + d_r] (THD, "
                         f"no batch dim), got {tuple(q.shape)}")
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{fn}: cu_seqlens is a {type(cu_seqlens).__name__}, not a tensor")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1:
        raise ValueError(f"{fn}: cu_seqlens must be a 1-D int32 or int64 tensor [N + 1], got "
                         f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{fn}: cu_seqlens on {cu_seqlens.device}: give it on cpu or cuda")


def _apply(owner, tensors, form, causal, sp_group, head_groups, cu_seqlens, fn):
    _check(tensors, cu_seqlens, fn)
    if form not in _capi.FORMS:
        raise ValueError(f"{fn}: form = {form!r}; one of {', '.join(_capi.FORMS)}")
    _capi.check_c_int(f"{fn}: head_groups", int(head_groups))
    group = "" if sp_group is None else sp_group.group_name
    return _fwd(*tensors, owner.key, form, bool(causal), int(head_groups), group,
                cu_seqlens)[0]


def mla_attention(q, c_kv, k_rope, w_kv_b, *, model, form="laga", causal=True, sp_group=None,
                  head_groups=0, cu_seqlens=None):
    """MLA attention of this rank's sequence shard, differentiable in all four inputs.

    model: an mlagen.Model (or anything Model accepts, read again at every call: pass a
    Model to keep its plan cache). form: "explicit", "absorbed", "laga", "laga-r", "laga-f"
    or "laga-cp" (head_groups: laga-f's and laga-cp's, 0 picks; laga-cp's token shard is
    two chunks: mlagen.token_positions). sp_group: a torch.distributed process
    group over which the sequence is split (gloo for CPU tensors, NCCL for CUDA), None for
    none. Returns o [B, S_l, H, d_v]. w_kv_b's gradient is this rank's partial sum: the
    trainer's gradient reduction over the group adds the ranks' parts.
    cu_seqlens: packed sequences (docs/packed.md): a 1-D int32 or int64 tensor [N + 1], cpu
    or cuda, of the N documents' boundaries in the whole packed stream of T_cap = T_l P
    token rows (the same on every rank: 0, non-decreasing, at most T_cap; rows from
    cu_seqlens[N] on are slack: o, dq, dc_kv, dk_rope 0 there). q is then [T_l, H,
    d_n + d_r], c_kv [T_l, d_c], k_rope [T_l, d_r] and o [T_l, H, d_v]: this rank's rows
    of the stream (mlagen.token_positions(form, T_cap, P, rank)); attention stays inside
    each document, causal by the order in it. Its values are read to the host once per
    forward and once per backward (a CUDA tensor: a copy that waits for its stream). The
    plan depends on T_cap only, not on the documents.
    Raises MlagenError (the C API's message) for a bad shape, dtype or group, or bad
    boundaries (naming the index: "tensors->cu_seqlens[3] = 10 is below ..."); ValueError
    for tensors on different devices, an unsupported device or dtype (naming the tensor),
    an unknown form, a batch or head_groups beyond a C int, cu_seqlens not 1-D int32/int64
    or an int64 value beyond int32 (naming the index), q not 4-d without cu_seqlens or not
    3-d with them; TypeError for cu_seqlens not a tensor.
    Under torch.compile(fullgraph=True), pass a Model made outside the compiled code (a
    dict or path makes one at every call, which the graph cannot hold).
    Registered as the custom ops mlagen::mla_attention_fwd / _bwd (torch.library)."""
    if not isinstance(model, Model):
        model = Model(model)
    return _apply(_owner_of(model), (q, c_kv, k_rope, w_kv_b), form, causal, sp_group,
                  head_groups, cu_seqlens, "mla_attention")


class MLACoreAttention(torch.nn.Module):
    """The attention core of an MLA layer (after RoPE, before o_proj) as a module:
    forward(q, c_kv, k_rope, w_kv_b, cu_seqlens=None) -> o, as mla_attention (cu_seqlens:
    packed sequences, THD tensors). config: an mlagen.Model or anything it accepts. One
    plan is cached per (B, S, dtype, device) of the inputs, and one per (T_cap, dtype,
    device) for packed sequences whatever their documents. copy.deepcopy works (the copy
    shares sp_group and starts with an empty plan cache), and so does pickling (torch.save)
    of a module without an sp_group (with one: TypeError, a process group is not
    serializable)."""

    def __init__(self, config, form="laga", sp_group=None, causal=True, head_groups=0):
        super().__init__()
        self.model = config if isinstance(config, Model) else Model(config)
        self.form, self.sp_group, self.causal, self.head_groups = form, sp_group, causal, head_groups
        self._plans = {}
        self._owner = _Owner(self.model, self._plans)

    def __getstate__(self):
        # pickle (torch.save): the plan cache (C handles) stays behind, rebuilt empty; a
        # process group cannot be serialized, and dropping it would make a loaded module
        # attend over its shard alone
        if self.sp_group is not None:
            raise TypeError("MLACoreAttention: a module with an sp_group cannot be pickled (a "
                            "process group is not serializable): set module.sp_group = None "
                            "before saving and give the group again after loading")
        state = self.__dict__.copy()
        del state["_plans"], state["_owner"]
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._plans = {}
        self._owner = _Owner(self.model, self._plans)

    def __copy__(self):
        # a shallow copy shares everything, the group and the plan cache included
        new = self.__class__.__new__(self.__class__)
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo):
        # the copy shares the process group (a handle to the same ranks), not the plans
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_plans", "_owner", "sp_group")}
        new.__setstate__(copy.deepcopy(state, memo))
        new.sp_group = self.sp_group
        return new

    def forward(self, q, c_kv, k_rope, w_kv_b, cu_seqlens=None):
        return _apply(self._owner, (q, c_kv, k_rope, w_kv_b), self.form, self.causal,
                      self.sp_group, self.head_groups, cu_seqlens, "MLACoreAttention")

    def extra_repr(self):
        return f"form={self.form!r}, causal={self.causal}, model={self.model!r}"
