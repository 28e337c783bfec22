"""_dlpack.py: a torch tensor over device memory that libsymm owns (a
variant's symmetric buffer or scratch), through a DLPack capsule built with
ctypes: no copy, no C++ extension, and the device named explicitly rather
than asked of the pointer.

The tensor does not own the memory: the variant frees it at destroy, so
its views must not be used after that (Buffer.destroy says so)."""

import ctypes

import torch

_KDLCUDA = 2
_KDLUINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_NAME = b"dltensor"

# torch reads a managed tensor's deleter when its tensor is freed (it is
# NULL here: the variant owns the memory), so every managed tensor handed
# out stays alive for the life of the process (a few dozen bytes each,
# made once per variant).
_kept = []


def device_bytes(ptr, nbytes, device_index):
    """A uint8 tensor [nbytes] over device memory at ptr on cuda:device_index."""
    shape = (ctypes.c_int64 * 1)(nbytes)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(data=ptr, device=_DLDevice(_KDLCUDA, device_index), ndim=1,
                                  dtype=_DLDataType(_KDLUINT, 8, 1), shape=shape, strides=None,
                                  byte_offset=0)
    managed.manager_ctx = None
    managed.deleter = None
    _kept.append((managed, shape))
    capsule = _capsule_new(ctypes.addressof(managed), _NAME, None)
    return torch.utils.dlpack.from_dlpack(capsule)
