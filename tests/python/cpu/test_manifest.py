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


def test_auto_variant_has_both_forms_and_takes_y_anywhere(default_manifest):
    auto = default_manifest.variant("bf16_rank_auto_w2")
    assert auto.combine == "auto" and auto.auto and not auto.pull and auto.has_y_region
    push = default_manifest.variant("bf16_rank_w2")
    pull = default_manifest.variant("bf16_rank_pull_w2")
    assert not push.auto and not push.has_y_region and pull.has_y_region and not pull.auto
    # y may lie anywhere (pushing) or in region y (pulling): not required symmetric.
    assert "y" not in auto.symmetric_arguments("combine")
    y_arg = [a for a in auto.arguments["combine"] if a["name"] == "y"][0]
    assert "auto" in y_arg["note"]
    # Both forms' places: region y for the pull, combine_in and its flags for the push.
    assert auto.regions["y"][1] == auto.capacity * auto.hidden * 2 and auto.regions["y"][2] is True
    assert auto.regions["combine_in"][1] == auto.world * auto.max_tokens * auto.hidden * 2
    assert auto.regions["combine_flags"][1] == auto.world * auto.max_tokens * 8
    assert auto.symmetric_bytes > push.symmetric_bytes


def test_combine_mode_is_checked(tmp_path, default_manifest):
    fields = dict(default_manifest.variant("bf16_rank_w2").fields, combine="sideways")
    with pytest.raises(manifest.ManifestError, match="field combine: got 'sideways', expected push, pull or auto"):
        manifest.load(write(tmp_path, {"format": 2, "variants": [fields]}))
    fields = dict(default_manifest.variant("bf16_expert_w2").fields, combine="auto")
    with pytest.raises(manifest.ManifestError, match="expected push or pull with layout expert"):
        manifest.load(write(tmp_path, {"format": 2, "variants": [fields]}))


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
