"""manifest.py: a manifest's variants and fields, and its errors."""
import json

import pytest

from symmgen import manifest


def test_default_spec_variants(default_manifest):
    m = default_manifest
    assert "bf16_rank_w2" in m.names and "bf16_expert_a64_w4" in m.names
    v = m.variant("fp8_expert_a128_w2")
    assert (v.hidden, v.topk, v.experts, v.world, v.local_experts) == (4096, 4, 32, 2, 16)
    assert (v.dtype, v.combine_dtype, v.layout, v.align, v.weights) == ("fp8_e4m3", "fp16", "expert", 128, True)
    assert v.scale_cols == 32
    assert v.capacity == v.worst_capacity
    assert v.regions["recv_x"][1] == v.capacity * v.hidden
    assert v.combine_order in ("rank", "k")


def test_pull_variant_declares_y_symmetric(default_manifest):
    pull = default_manifest.variant("bf16_rank_pull_w2")
    push = default_manifest.variant("bf16_rank_w2")
    assert pull.pull and not push.pull
    assert "y" in pull.symmetric_arguments("combine")
    assert "y" not in push.symmetric_arguments("combine")
    assert pull.regions["y"][2] is True


def test_capacity_below_worst_case(default_manifest):
    v = default_manifest.variant("bf16_rank_cap_w2")
    assert v.capacity == v.world * v.max_tokens // 2 < v.worst_capacity


def test_names_and_lookup_errors(default_manifest):
    with pytest.raises(manifest.ManifestError, match="variants .*bf16_rank_w2.*: name the one to use"):
        default_manifest.variant()
    with pytest.raises(manifest.ManifestError, match="no variant 'nope': the manifest has bf16_rank_w2, "):
        default_manifest.variant("nope")


def write(tmp_path, data):
    path = tmp_path / "manifest.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_unreadable_and_malformed(tmp_path, default_manifest):
    with pytest.raises(manifest.ManifestError, match="cannot read the manifest"):
        manifest.load(str(tmp_path / "none.json"))
    with pytest.raises(manifest.ManifestError, match="not a JSON manifest"):
        manifest.load(write(tmp_path, "{ nope"))
    with pytest.raises(manifest.ManifestError, match="format 3: this package reads manifest format 2"):
        manifest.load(write(tmp_path, {"format": 3, "variants": []}))
    fields = dict(default_manifest.variant("bf16_rank_w2").fields)
    del fields["hidden"]
    with pytest.raises(manifest.ManifestError, match="variant bf16_rank_w2: field hidden: got None, expected an integer"):
        manifest.load(write(tmp_path, {"format": 2, "variants": [fields]}))
    fields = dict(default_manifest.variant("bf16_rank_w2").fields, dtype="int4")
    with pytest.raises(manifest.ManifestError, match="field dtype: got 'int4', expected one of bf16, fp16, fp32"):
        manifest.load(write(tmp_path, {"format": 2, "variants": [fields]}))


def test_directory_and_single_variant(tmp_path, default_manifest):
    fields = default_manifest.variant("bf16_rank_w2").fields
    write(tmp_path, {"format": 2, "spec": "x.lua", "variants": [fields]})
    m = manifest.load(str(tmp_path))
    assert m.variant().name == "bf16_rank_w2"
    assert m.spec == "x.lua"
