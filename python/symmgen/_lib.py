"""_lib.py: libsymm through ctypes: where the library and symmgen are, the C
structures the package passes, and how a symm_status becomes an exception.

The structures mirror runtime/include/*.h field for field (C order, C
types); tests/python/cpu/test_abi.py compiles a probe against those headers
and checks every size and offset, so a header that grows a field fails there
first. Nothing here needs torch."""

import ctypes
import os
import shutil

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))


class SymmError(RuntimeError):
    """A libsymm call failed: `status` is the C status name
    (SYMM_ERR_TIMEOUT, ...), the message is the library's own."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _candidates(name, subdir):
    """Where a file of the build may be: SYMMGEN_BUILD_DIR, the copy
    installed inside the package, then the checkout's build/ (running from
    a checkout without installing)."""
    out = []
    env = os.environ.get("SYMMGEN_BUILD_DIR")
    if env:
        out.append(os.path.join(env, subdir, name))
    out.append(os.path.join(_HERE, "_bin", name))
    out.append(os.path.join(_REPO, "build", subdir, name))
    return out


def find_file(name, subdir):
    """The first existing candidate for a built file; FileNotFoundError
    listing every place looked at otherwise."""
    tried = _candidates(name, subdir)
    for path in tried:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"symmgen: {name} not found (looked at {', '.join(tried)}): install the package "
        f"with `pip install ./python` from a checkout, run `make` there, or set SYMMGEN_BUILD_DIR "
        f"to a build directory")


def symmgen_path():
    """The symmgen executable the package runs."""
    path = find_file("symmgen", "bin")
    if not os.access(path, os.X_OK):
        raise PermissionError(f"symmgen: {path} is not executable (chmod +x it)")
    return path


# --- enumerations (symm_types.h, symm_variant.h) ---------------------------

DTYPES = {"bf16": 0, "fp16": 1, "fp32": 2, "fp8_e4m3": 3}
DTYPE_SIZES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1}
LAYOUTS = {"rank": 0, "expert": 1}
COMBINE_ORDERS = {"rank": 0, "k": 1}
BACKENDS = {None: 0, "native": 1, "nccl": 2, "hybrid": 3}
# Elements per fp8 scale (SYMM_FP8_BLOCK).
FP8_BLOCK = 128


# --- structures -------------------------------------------------------------

c_int, c_int64, c_uint64, c_void_p, c_char_p, c_double = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_double)


class WorldConfig(ctypes.Structure):
    """symm_world_config (symm_world.h)."""
    _fields_ = [("rank", c_int), ("size", c_int), ("local_rank", c_int), ("device", c_int),
                ("job_id", c_char_p), ("secret", c_char_p), ("socket_dir", c_char_p),
                ("timeout_s", c_double), ("root_addr", c_char_p), ("host_id", c_char_p),
                ("local_size", c_int)]


class VariantOptions(ctypes.Structure):
    """symm_variant_options (symm_variant.h)."""
    _fields_ = [("backend", c_int), ("cache_dir", c_char_p), ("timeout_s", c_double),
                ("tune", c_char_p)]


class DispatchArgs(ctypes.Structure):
    """symm_dispatch_args (symm_variant.h)."""
    _fields_ = [("tokens", c_int), ("tokens_dev", c_void_p), ("x", c_void_p),
                ("x_scales", c_void_p), ("topk_idx", c_void_p), ("topk_weights", c_void_p)]


class RecvBuffers(ctypes.Structure):
    """symm_recv_buffers (symm_variant.h): CUdeviceptr is 64 bits."""
    _fields_ = [(name, c_uint64) for name in (
        "x", "scales", "src", "topk_idx", "weights", "expert_count", "expert_offset", "rows", "y")]


class VariantStats(ctypes.Structure):
    """symm_variant_stats (symm_variant.h)."""
    _fields_ = [("calls", c_uint64)] + [(name, c_int) for name in (
        "tokens", "recv_rows", "invalid", "dropped_send", "dropped_recv", "clamped", "timed_out",
        "timeout_peer", "timeout_phase", "mismatch", "mismatch_peer")]


class RefConfig(ctypes.Structure):
    """symm_ref_config (symm_ref.h)."""
    _fields_ = [("hidden", c_int), ("topk", c_int), ("experts", c_int), ("world", c_int),
                ("max_tokens", c_int), ("dtype", c_int), ("combine_dtype", c_int), ("layout", c_int),
                ("weights", c_int), ("capacity", c_int64), ("align", c_int), ("combine_order", c_int),
                ("hosts", c_int)]


class RefInput(ctypes.Structure):
    """symm_ref_input (symm_ref.h)."""
    _fields_ = [("tokens", c_int), ("x", c_void_p), ("x_scales", c_void_p), ("topk_idx", c_void_p),
                ("topk_weights", c_void_p)]


class RefRecv(ctypes.Structure):
    """symm_ref_recv (symm_ref.h)."""
    _fields_ = [("capacity", c_int64), ("rows", c_int64), ("x", c_void_p), ("scales", c_void_p),
                ("src", c_void_p), ("topk_idx", c_void_p), ("weights", c_void_p),
                ("expert_count", c_void_p), ("expert_offset", c_void_p), ("dropped", c_int64)]


class RefSendStats(ctypes.Structure):
    """symm_ref_send_stats (symm_ref.h)."""
    _fields_ = [("invalid", c_int64), ("dropped", c_int64)]


STRUCTS = {"symm_world_config": WorldConfig, "symm_variant_options": VariantOptions,
           "symm_dispatch_args": DispatchArgs, "symm_recv_buffers": RecvBuffers,
           "symm_variant_stats": VariantStats, "symm_ref_config": RefConfig,
           "symm_ref_input": RefInput, "symm_ref_recv": RefRecv,
           "symm_ref_send_stats": RefSendStats}

# name: (restype, argtypes)
_P = ctypes.POINTER
_FUNCTIONS = {
    "symm_last_error": (c_char_p, []),
    "symm_status_name": (c_char_p, [c_int]),
    "symm_clear_error": (None, []),
    "symm_world_create": (c_int, [_P(WorldConfig), _P(c_void_p)]),
    "symm_world_destroy": (None, [c_void_p]),
    "symm_world_rank": (c_int, [c_void_p]),
    "symm_world_size": (c_int, [c_void_p]),
    "symm_world_device": (c_int, [c_void_p]),
    "symm_world_local_rank": (c_int, [c_void_p]),
    "symm_world_host": (c_int, [c_void_p]),
    "symm_world_host_count": (c_int, [c_void_p]),
    "symm_world_local_size": (c_int, [c_void_p]),
    "symm_world_rank_host": (c_int, [c_void_p, c_int]),
    "symm_world_host_name": (c_char_p, [c_void_p, c_int]),
    "symm_world_host_major": (c_int, [c_void_p]),
    "symm_world_host_world": (c_void_p, [c_void_p]),
    "symm_world_allgather": (c_int, [c_void_p, c_void_p, c_void_p, ctypes.c_size_t]),
    "symm_variant_open": (c_int, [c_void_p, c_char_p, c_char_p, _P(VariantOptions), _P(c_void_p)]),
    "symm_variant_destroy": (c_int, [c_void_p]),
    "symm_variant_backend": (c_int, [c_void_p]),
    "symm_variant_dispatch": (c_int, [c_void_p, _P(DispatchArgs), c_void_p]),
    "symm_variant_combine": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "symm_variant_recv": (c_int, [c_void_p, _P(RecvBuffers)]),
    "symm_variant_stats_read": (c_int, [c_void_p, c_void_p, _P(VariantStats)]),
    "symm_ref_capacity": (c_int64, [_P(RefConfig)]),
    "symm_ref_worst_capacity": (c_int64, [_P(RefConfig)]),
    "symm_ref_check_config": (c_int, [_P(RefConfig)]),
    "symm_ref_dispatch": (c_int, [_P(RefConfig), _P(RefInput), _P(RefRecv), _P(RefSendStats)]),
    "symm_ref_combine": (c_int, [_P(RefConfig), _P(RefInput), _P(RefRecv), _P(c_void_p), _P(c_void_p)]),
    "symm_f32_to_bf16": (ctypes.c_uint16, [ctypes.c_float]),
    "symm_bf16_to_f32": (ctypes.c_float, [ctypes.c_uint16]),
    "symm_f32_to_f16": (ctypes.c_uint16, [ctypes.c_float]),
    "symm_f16_to_f32": (ctypes.c_float, [ctypes.c_uint16]),
    "symm_f32_to_e4m3": (ctypes.c_uint8, [ctypes.c_float]),
    "symm_e4m3_to_f32": (ctypes.c_float, [ctypes.c_uint8]),
}

_lib = None


def lib():
    """libsymm.so, loaded once, with every function's types declared."""
    global _lib
    if _lib is None:
        handle = ctypes.CDLL(find_file("libsymm.so", "lib"))
        for name, (restype, argtypes) in _FUNCTIONS.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = handle
    return _lib


def error(status):
    """The SymmError for a failed status, with this thread's C message."""
    lb = lib()
    name = lb.symm_status_name(status).decode()
    message = (lb.symm_last_error() or b"").decode(errors="replace") or name
    return SymmError(name, message)


def check(status):
    """Raise SymmError unless status is SYMM_OK."""
    if status != 0:
        raise error(status)


def library_path():
    """Where the loaded libsymm.so lives (for messages and tests)."""
    return lib()._name


def have_compiler():
    """Whether a C compiler is on PATH (the ABI probe needs one)."""
    return shutil.which(os.environ.get("CC", "cc")) is not None
