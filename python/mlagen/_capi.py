"""ctypes bindings of include/mlagen.h (the subset the package uses).

The library is found, in order: $MLAGEN_LIBRARY (a path to libmlagen.so), the build tree
this package sits in (../build/libmlagen.so next to python/, for a source checkout), the
system's (ctypes.util.find_library("mlagen")). Structs mirror mlagen.h field by field.
"""
import ctypes
import ctypes.util
import os
import threading

MAX_DIMS = 4

DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_F64 = 1, 2, 3, 4
FORMS = {"explicit": 1, "absorbed": 2, "laga": 3, "laga-r": 4, "laga-f": 5, "laga-cp": 6}
DEVICE_CUDA, DEVICE_CPU = 0, 1
PASS_FORWARD, PASS_BACKWARD = 1, 2


class ModelDesc(ctypes.Structure):
    _fields_ = [("num_attention_heads", ctypes.c_int), ("kv_lora_rank", ctypes.c_int),
                ("qk_rope_head_dim", ctypes.c_int), ("qk_nope_head_dim", ctypes.c_int),
                ("v_head_dim", ctypes.c_int), ("softmax_scale", ctypes.c_double)]


class PlanDesc(ctypes.Structure):
    _fields_ = [("form", ctypes.c_int), ("batch", ctypes.c_int), ("seq", ctypes.c_int64),
                ("sp_rank", ctypes.c_int), ("sp_size", ctypes.c_int), ("causal", ctypes.c_int),
                ("dtype", ctypes.c_int), ("head_groups", ctypes.c_int), ("device", ctypes.c_int),
                ("varlen", ctypes.c_int)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("dims", ctypes.c_int64 * MAX_DIMS), ("bytes", ctypes.c_size_t),
                ("is_output", ctypes.c_int), ("passes", ctypes.c_int)]


TENSOR_FIELDS = ["q", "c_kv", "k_rope", "w_kv_b", "o", "d_o", "dq", "dc_kv", "dk_rope", "dw_kv_b"]


class Sizes(ctypes.Structure):
    _fields_ = [("workspace_bytes", ctypes.c_size_t), ("saved_bytes", ctypes.c_size_t),
                ("peak_fwd_bytes", ctypes.c_size_t), ("peak_bwd_bytes", ctypes.c_size_t),
                ("sent_fwd_bytes", ctypes.c_size_t), ("sent_bwd_bytes", ctypes.c_size_t)] + \
               [(f, TensorInfo) for f in TENSOR_FIELDS]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("dims", ctypes.c_int64 * MAX_DIMS)]


class Tensors(ctypes.Structure):
    _fields_ = [(f, Tensor) for f in TENSOR_FIELDS] + \
               [("cu_seqlens", ctypes.POINTER(ctypes.c_int32)), ("n_cu_seqlens", ctypes.c_int64)]


COLLECTIVE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class CommOps(ctypes.Structure):
    _fields_ = [("size", ctypes.c_int), ("rank", ctypes.c_int), ("user", ctypes.c_void_p),
                ("all_to_all", COLLECTIVE), ("all_gather", COLLECTIVE),
                ("reduce_scatter", COLLECTIVE)]


INT_MIN, INT_MAX = -2**31, 2**31 - 1


def check_c_int(what, v):
    """Raises ValueError when v does not fit a C int (ctypes would silently truncate it)."""
    if not INT_MIN <= v <= INT_MAX:
        raise ValueError(f"{what} = {v} does not fit a C int [{INT_MIN}, {INT_MAX}]")


def check_int64(what, v):
    """v as an int: TypeError unless it is an integer (a bool, a float or a str is not: int()
    would truncate 2.7 to 2), ValueError when it does not fit int64 (ctypes would wrap it)."""
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{what} = {v!r} is a {type(v).__name__}, not an integer")
    v = v.__index__()
    if not -2**63 <= v < 2**63:
        raise ValueError(f"{what} = {v} does not fit int64")
    return v


class MlagenError(RuntimeError):
    """A failed C API call: .status (the negative MLAGEN_E* code), .status_name
    ("MLAGEN_EINVAL") and the C API's message (mlagen_last_message) as str(e)."""

    def __init__(self, status, status_name, message):
        super().__init__(f"{status_name}: {message}")
        self.status = status
        self.status_name = status_name
        self.message = message


_lib = None
_lock = threading.Lock()


def _find():
    env = os.environ.get("MLAGEN_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "..", "build", "libmlagen.so"),):
        if os.path.exists(cand):
            return os.path.normpath(cand)
    found = ctypes.util.find_library("mlagen")
    if found:
        return found
    raise OSError("libmlagen.so not found: set MLAGEN_LIBRARY to its path (build it with "
                  "cmake; it is build/libmlagen.so in a source checkout) or install it")


def lib():
    """The loaded library (loaded once per process)."""
    global _lib
    with _lock:
        if _lib is None:
            L = ctypes.CDLL(_find())
            P, I = ctypes.c_void_p, ctypes.c_int
            sig = {
                "mlagen_strerror": (ctypes.c_char_p, [I]),
                "mlagen_status_name": (ctypes.c_char_p, [I]),
                "mlagen_context_create": (I, [ctypes.POINTER(P)]),
                "mlagen_context_destroy": (None, [P]),
                "mlagen_last_message": (ctypes.c_char_p, [P]),
                "mlagen_model_from_config": (I, [P, ctypes.c_char_p, ctypes.POINTER(P)]),
                "mlagen_model_from_desc": (I, [P, ctypes.POINTER(ModelDesc), ctypes.POINTER(P)]),
                "mlagen_model_get_desc": (I, [P, ctypes.POINTER(ModelDesc)]),
                "mlagen_model_destroy": (None, [P]),
                "mlagen_plan_create": (I, [P, P, ctypes.POINTER(PlanDesc), ctypes.POINTER(P)]),
                "mlagen_plan_destroy": (None, [P]),
                "mlagen_plan_sizes": (I, [P, ctypes.POINTER(Sizes)]),
                "mlagen_plan_kernel": (I, [P, I, ctypes.POINTER(I), ctypes.POINTER(ctypes.c_char_p),
                                           ctypes.POINTER(ctypes.c_char_p)]),
                "mlagen_token_position": (I, [ctypes.POINTER(PlanDesc), ctypes.c_int64,
                                              ctypes.POINTER(ctypes.c_int64)]),
                "mlagen_plan_set_comm_ops": (I, [P, ctypes.POINTER(CommOps)]),
                "mlagen_plan_set_comm_wait": (I, [P, ctypes.c_double]),
                "mlagen_forward": (I, [P, ctypes.POINTER(Tensors), P, ctypes.c_size_t, P,
                                       ctypes.c_size_t, P]),
                "mlagen_backward": (I, [P, ctypes.POINTER(Tensors), P, ctypes.c_size_t, P,
                                        ctypes.c_size_t, P]),
            }
            for name, (res, args) in sig.items():
                fn = getattr(L, name)
                fn.restype, fn.argtypes = res, args
            _lib = L
    return _lib


def check(rc, ctx):
    """Raises MlagenError with the context's message when rc is nonzero."""
    if rc:
        L = lib()
        msg = L.mlagen_last_message(ctx).decode(errors="replace")
        raise MlagenError(rc, L.mlagen_status_name(rc).decode(), msg)


class Context:
    """One mlagen_context (messages); destroyed with the object."""

    def __init__(self):
        L = lib()
        h = ctypes.c_void_p()
        check(L.mlagen_context_create(ctypes.byref(h)), None)
        self.handle = h
        self._destroy = L.mlagen_context_destroy

    def __del__(self):
        if getattr(self, "handle", None):
            self._destroy(self.handle)
            self.handle = None
