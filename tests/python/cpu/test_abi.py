"""The ctypes structures of _lib.py against the C headers: a probe compiled
against runtime/include prints every size and offset (and the enumerations'
values), so a field added to a header fails here until _lib.py has it."""
import ctypes
import os
import shutil
import subprocess

import pytest

from symmgen import _lib

from support import ROOT

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
CC = os.environ.get("CC", "cc")
ENUMS = {**{f"SYMM_DTYPE_{k.upper()}": v for k, v in _lib.DTYPES.items()},
         **{f"SYMM_LAYOUT_{k.upper()}": v for k, v in _lib.LAYOUTS.items()},
         "SYMM_BACKEND_DEFAULT": _lib.BACKENDS[None], "SYMM_BACKEND_NATIVE": _lib.BACKENDS["native"],
         "SYMM_BACKEND_NCCL": _lib.BACKENDS["nccl"], "SYMM_BACKEND_HYBRID": _lib.BACKENDS["hybrid"],
         "SYMM_FP8_BLOCK": _lib.FP8_BLOCK,
         **{f"SYMM_COMBINE_ORDER_{k.upper()}": v for k, v in _lib.COMBINE_ORDERS.items()}}


def probe_source():
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "symm_manifest.h"', '#include "symm_ref.h"',
             "int main(void) {"]
    for cname, struct in _lib.STRUCTS.items():
        lines.append(f'    printf("{cname} . %zu\\n", sizeof({cname}));')
        for field, _ in struct._fields_:
            lines.append(f'    printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    for name in ENUMS:
        lines.append(f'    printf("enum {name} %d\\n", (int){name});')
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    if shutil.which(CC) is None or not os.path.isfile(os.path.join(CUDA_HOME, "include", "cuda.h")):
        pytest.skip(f"needs a C compiler ({CC}) and the CUDA headers ({CUDA_HOME}/include)")
    d = tmp_path_factory.mktemp("abi")
    src, exe = d / "probe.c", d / "probe"
    src.write_text(probe_source())
    build = subprocess.run([CC, "-std=c11", "-I", os.path.join(ROOT, "runtime", "include"), "-I",
                            os.path.join(CUDA_HOME, "include"), str(src), "-o", str(exe)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert build.returncode == 0, build.stdout.decode()
    out = {}
    for line in subprocess.check_output([str(exe)]).decode().splitlines():
        a, b, n = line.split()
        out[(a, b)] = int(n)
    return out


@pytest.mark.parametrize("cname", sorted(_lib.STRUCTS))
def test_struct_matches_header(layout, cname):
    struct = _lib.STRUCTS[cname]
    for field, _ in struct._fields_:
        assert getattr(struct, field).offset == layout[(cname, field)], f"{cname}.{field}"
    assert ctypes.sizeof(struct) == layout[(cname, ".")], \
        f"{cname}: ctypes {ctypes.sizeof(struct)} bytes, C {layout[(cname, '.')]} (a field missing in _lib.py?)"


def test_enumerations_match_header(layout):
    for name, value in ENUMS.items():
        assert layout[("enum", name)] == value, name


def header_fields(cname):
    """The member names of `typedef struct cname { ... } cname;` in the
    public headers, in order (a trailing int can hide in padding, where
    sizeof does not see it; the names do)."""
    import re
    for header in os.listdir(os.path.join(ROOT, "runtime", "include")):
        with open(os.path.join(ROOT, "runtime", "include", header)) as f:
            text = f.read()
        m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (cname, cname), text, re.S)
        if not m:
            continue
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
        names = []
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            words = decl.split(None, 1)
            declarators = words[1] if decl.split()[0] not in ("const", "unsigned") else decl.split(None, 2)[2]
            for d in declarators.split(","):
                names.append(re.sub(r"\[.*\]", "", d).strip().lstrip("*").strip())
        return names
    raise AssertionError(f"{cname} not found in runtime/include")


@pytest.mark.parametrize("cname", sorted(_lib.STRUCTS))
def test_struct_has_every_header_field(cname):
    assert [f for f, _ in _lib.STRUCTS[cname]._fields_] == header_fields(cname)
