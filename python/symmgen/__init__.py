"""symmgen: MoE dispatch and combine from generated CUDA kernels (libsymm),
as PyTorch tensors in and out.

    import symmgen
    buf = symmgen.Buffer(group, {"hidden": 4096, "topk": 8, "experts": 64,
                                 "max_tokens": 256, "dtype": "bf16"})
    r = buf.dispatch(x, topk_idx, topk_weights)
    out = buf.combine(experts(r.recv_x))

Buffer, World, DispatchResult and the torch ops (symmgen.ops) need torch
and are imported on first use; spec, manifest, ref and checks do not."""

from ._lib import SymmError
from . import checks, manifest, ref, spec
from .manifest import Manifest, ManifestError, Variant
from .spec import SpecError, lua_spec

__all__ = ["Buffer", "DispatchResult", "World", "SymmError", "SpecError", "ManifestError", "Manifest",
           "Variant", "lua_spec", "checks", "manifest", "ref", "spec"]

_LAZY = {"Buffer": "buffer", "DispatchResult": "buffer", "World": "world"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    if name in ("ops", "torch_ref", "buffer", "world"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'symmgen' has no attribute {name!r}")


def _version():
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "VERSION"), os.path.join(here, "..", "..", "VERSION")):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            pass
    return "0.0.0"


__version__ = _version()
