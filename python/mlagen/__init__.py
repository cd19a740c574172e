"""mlagen: Multi-head Latent Attention forms for sequence-parallel training, over libmlagen.so.

    import mlagen, mlagen.torch
    model = mlagen.Model("deepseek-v3")        # a path, a shipped name, a dict or a PretrainedConfig
    o = mlagen.torch.mla_attention(q, c_kv, k_rope, w_kv_b, model=model, form="laga")

See docs/torch.md.
"""
import ctypes
import itertools
import json
import os
import tempfile
import weakref

from . import _capi
from ._capi import MlagenError

__all__ = ["Model", "MlagenError", "token_positions"]
__version__ = "0.1.0"


def token_positions(form, seq, sp_size, sp_rank):
    """The global sequence positions of rank sp_rank's seq / sp_size tokens under form, in
    row order: the rank's token shard (what q, c_kv, k_rope and do hold, and o, dq, dc_kv,
    dk_rope return). Contiguous for the Ulysses forms; under "laga-cp" two chunks so that
    causal work is even (chunks r and 2P - 1 - r of 2P for even seq / sp_size; see
    mlagen_plan_desc.sp_rank in include/mlagen.h). Shard a global [B, S, ...] tensor x with
    x[:, token_positions(...)]. Raises ValueError for an unknown form, MlagenError (the C
    API's message, mlagen_token_position) for a bad seq, sp_size or sp_rank, ValueError for
    one beyond int64 (seq) or a C int (the others), TypeError for one that is not an
    integer."""
    if form not in _capi.FORMS:
        raise ValueError(f"token_positions: form = {form!r}; one of {', '.join(_capi.FORMS)}")
    seq, sp_size, sp_rank = (_capi.check_int64(f"token_positions: {what}", v) for what, v in
                             (("seq", seq), ("sp_size", sp_size), ("sp_rank", sp_rank)))
    for what, v in (("sp_size", sp_size), ("sp_rank", sp_rank)):
        _capi.check_c_int(f"token_positions: {what}", v)
    L = _capi.lib()
    desc = _capi.PlanDesc(_capi.FORMS[form], 1, seq, sp_rank, sp_size, 0, 0, 0, 0)
    n = seq // sp_size if sp_size > 0 else 0
    out, pos = [], ctypes.c_int64()
    for i in range(max(n, 1)):
        _capi.check(L.mlagen_token_position(ctypes.byref(desc), i, ctypes.byref(pos)), None)
        out.append(pos.value)
    return out


class _Owner:
    """A model and a plan cache, which mlagen.torch's custom ops reach by an int key (their
    arguments are tensors and plain values). Made when the Model (or MLACoreAttention) is,
    not at the op's first call, so that torch.compile(fullgraph=True) traces a first call
    too (a weak reference made inside the traced code breaks the graph). Keys come from a
    counter, never reused (an id() could name a later owner once this one is freed); the
    autograd node of a forward holds its owner, so backward finds it even when nothing
    else does."""

    def __init__(self, model, plans):
        self.model, self.plans = model, plans
        self.key = next(_KEYS)
        _OWNERS[self.key] = self


_OWNERS = weakref.WeakValueDictionary()
_KEYS = itertools.count(1)


def _model_from_desc(heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
                     softmax_scale):
    """A Model of these dims and softmax scale (mlagen_model_from_desc): how a Model is
    copied and unpickled (Model.__reduce__)."""
    m = Model.__new__(Model)
    m._ctx = _capi.Context()
    d = _capi.ModelDesc(heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
                        softmax_scale)
    h = ctypes.c_void_p()
    _capi.check(_capi.lib().mlagen_model_from_desc(m._ctx.handle, ctypes.byref(d),
                                                   ctypes.byref(h)), m._ctx.handle)
    m._adopt(h)
    return m


class Model:
    """An MLA attention shape (mlagen_model) and its softmax scale, from a HF config.

    config: a path to a config.json (or a directory holding one), a shipped name
    ("deepseek-v3", "deepseek-v2-lite", "kimi-k2"), a dict of config.json's keys, or a
    transformers.PretrainedConfig. The C API reads it (mlagen_model_from_config), so the
    softmax scale includes the yarn mscale as DeepSeek's modeling code (and `mlagen info`)
    computes it. Raises MlagenError with the C API's message for a bad config.

    Attributes: heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
    softmax_scale. Plans made for this model are cached on it (see mlagen.torch).
    copy.deepcopy and pickle (torch.save of a module holding one) give a Model of the same
    dims and softmax scale, with an empty plan cache."""

    def __init__(self, config):
        L = _capi.lib()
        self._ctx = _capi.Context()
        path, tmp = self._as_path(config), None
        if path is None:
            text = config.to_json_string() if hasattr(config, "to_json_string") else \
                json.dumps(config)
            fd, tmp = tempfile.mkstemp(suffix=".json", prefix="mlagen-config-")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            path = tmp
        h = ctypes.c_void_p()
        try:
            _capi.check(L.mlagen_model_from_config(self._ctx.handle, path.encode(),
                                                   ctypes.byref(h)), self._ctx.handle)
        finally:
            if tmp:
                os.unlink(tmp)
        self._adopt(h)

    def _adopt(self, h):
        """Takes the mlagen_model h: its dims, an empty plan cache, an owner."""
        L = _capi.lib()
        self._handle = h
        self._destroy = L.mlagen_model_destroy
        d = _capi.ModelDesc()
        _capi.check(L.mlagen_model_get_desc(h, ctypes.byref(d)), None)
        self.heads = d.num_attention_heads
        self.kv_lora_rank = d.kv_lora_rank
        self.qk_rope_head_dim = d.qk_rope_head_dim
        self.qk_nope_head_dim = d.qk_nope_head_dim
        self.v_head_dim = d.v_head_dim
        self.softmax_scale = d.softmax_scale
        self.plans = {}  # key -> mlagen.torch's plan objects
        self._owner = _Owner(self, self.plans)

    def __reduce__(self):
        return (_model_from_desc, (self.heads, self.kv_lora_rank, self.qk_rope_head_dim,
                                   self.qk_nope_head_dim, self.v_head_dim, self.softmax_scale))

    @staticmethod
    def _as_path(config):
        if isinstance(config, os.PathLike):
            return os.fspath(config)
        if isinstance(config, str):
            return config
        if isinstance(config, dict) or hasattr(config, "to_json_string"):
            return None
        raise TypeError(f"mlagen.Model: config is a {type(config).__name__}; give a path, a "
                        "shipped name, a dict or a transformers.PretrainedConfig")

    def __repr__(self):
        return (f"mlagen.Model(H={self.heads}, d_c={self.kv_lora_rank}, "
                f"d_r={self.qk_rope_head_dim}, d_n={self.qk_nope_head_dim}, "
                f"d_v={self.v_head_dim}, softmax_scale={self.softmax_scale:.6g})")

    def __del__(self):
        self.plans = {}
        if getattr(self, "_handle", None):
            self._destroy(self._handle)
            self._handle = None
