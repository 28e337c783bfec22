"""spec.py: a dict of fields written as Lua (quoting, keys, values), and
generation through symmgen into the cache."""
import os
import multiprocessing

import pytest

from symmgen import manifest, spec

from support import ROOT

SMALL = {"name": "small", "hidden": 1024, "topk": 2, "experts": 8, "world": 2, "max_tokens": 64, "dtype": "bf16"}


def refusal(fields, cache):
    with pytest.raises(spec.SpecError) as e:
        spec.generate(text=spec.lua_spec(fields), cache_dir=cache)
    return str(e.value)


@pytest.mark.parametrize("value, shown", [
    ('a"b', r'"a\"b"'), ("back\\slash", r'"back\\slash"'), ("new\nline", r'"new\nline"'),
    ("tab\tx", r'"tab\tx"'), ("caf\u00e9", r'"caf\xc3\xa9"'), ("nul\0x", r'"nul\x00x"'),
    ("d\x012", r'"d\x012"'), ("", '""'),
])
def test_strings_reach_lua_byte_for_byte(value, shown, cache):
    # symmgen echoes a refused name with every byte escaped: what it shows is
    # what Lua read from the literal (a digit after \001 stays a digit).
    message = refusal(dict(SMALL, name=value), cache)
    assert f"field name: got {shown}, expected a C identifier" in message


def test_lua_string_is_ascii_with_three_digit_escapes():
    assert spec.lua_string("\x01" + "2") == '"\\0012"'
    assert spec.lua_string("\u00e9") == '"\\195\\169"'
    assert spec.lua_string('q"\\') == '"q\\"\\\\"'


def test_keys_bare_or_bracketed():
    assert spec.lua_key("hidden") == "hidden"
    assert spec.lua_key("end") == '["end"]'
    assert spec.lua_key("a-b") == '["a-b"]'
    with pytest.raises(TypeError, match="spec field names are strings: got int 3"):
        spec.lua_key(3)


def test_values():
    assert spec.lua_value("weights", True) == "true"
    assert spec.lua_value("weights", False) == "false"
    assert spec.lua_value("hidden", 7168) == "7168"
    assert spec.lua_value("x", 0.1) == "0.1"
    assert spec.lua_value("dtype", "bf16") == '"bf16"'


@pytest.mark.parametrize("value, error, text", [
    (float("nan"), ValueError, "spec field hidden: got nan, expected a finite number"),
    (float("inf"), ValueError, "spec field hidden: got inf, expected a finite number"),
    (1 << 64, ValueError, "expected an integer that fits in 64 bits"),
    ([1, 2], TypeError, "spec field hidden: got list [1, 2], expected a bool, an int, a float or a str"),
    ({"a": 1}, TypeError, "spec field hidden: got dict"),
])
def test_values_lua_cannot_hold(value, error, text):
    with pytest.raises(error, match=text.replace("[", r"\[").replace("]", r"\]")):
        spec.lua_spec(dict(SMALL, hidden=value))


def test_spec_text_name_first_none_left_out():
    text = spec.lua_spec({"hidden": 1024, "sms": None, "name": "n", "weights": False})
    assert text.splitlines()[-1] == 'layout { name = "n", hidden = 1024, weights = false }'
    assert text.startswith("-- ")
    with pytest.raises(TypeError, match="spec fields: got list, expected a dict"):
        spec.lua_spec([("name", "n")])


def test_fields_generate_a_manifest(cache):
    path = spec.generate_fields(dict(SMALL, layout="expert", align=8, weights=False), cache_dir=cache)
    v = manifest.load(path).variant("small")
    assert (v.hidden, v.topk, v.experts, v.world, v.max_tokens) == (1024, 2, 8, 2, 64)
    assert (v.dtype, v.combine_dtype, v.layout, v.align, v.weights) == ("bf16", "bf16", "expert", 8, False)
    assert os.path.isfile(os.path.join(os.path.dirname(path), "small.cu"))


def test_cache_reused_and_keyed_by_text(cache):
    first = spec.generate_fields(dict(SMALL, name="cached"), cache_dir=cache)
    stamp = os.stat(first).st_mtime_ns
    assert spec.generate_fields(dict(SMALL, name="cached"), cache_dir=cache) == first
    assert os.stat(first).st_mtime_ns == stamp
    other = spec.generate_fields(dict(SMALL, name="cached", max_tokens=32), cache_dir=cache)
    assert other != first
    assert manifest.load(other).variant("cached").max_tokens == 32
    assert not [d for d in os.listdir(os.path.dirname(os.path.dirname(first))) if ".tmp-" in d]


def test_refusal_names_field_and_hides_the_temporary_path(cache):
    message = refusal({"name": "bad", "hidden": 1024}, cache)
    assert "<spec from fields>:2: variant bad: field topk: missing, expected an integer 1..16" in message
    assert "field world: missing" in message
    assert ".tmp-" not in message
    message = refusal(dict(SMALL, colour="red"), cache)
    assert "colour" in message


def test_spec_file_with_defines(cache):
    path = spec.generate(spec_path=os.path.join(ROOT, "specs", "default.lua"), defines={"max_tokens": 512},
                         cache_dir=cache)
    m = manifest.load(path)
    # A companion (spec field hosts) takes hosts * max_tokens a call.
    assert all(v.max_tokens == 512 * (v.hosts if v.companion_of else 1) for v in m.variants.values())
    assert any(v.companion_of for v in m.variants.values())
    with pytest.raises(spec.SpecError, match="no such file"):
        spec.generate(spec_path=os.path.join(ROOT, "specs", "missing.lua"), cache_dir=cache)
    with pytest.raises(TypeError, match="give a spec_path or a text"):
        spec.generate(cache_dir=cache)


def _generate(args):
    fields, cache = args
    return spec.generate_fields(fields, cache_dir=cache)


def test_ranks_generating_at_once_share_one_tree(tmp_path):
    fields = dict(SMALL, name="racing")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        paths = pool.map(_generate, [(fields, str(tmp_path))] * 8)
    assert len(set(paths)) == 1
    assert manifest.load(paths[0]).variant("racing").hidden == 1024
    assert [d for d in os.listdir(tmp_path / "specs")] == [os.path.basename(os.path.dirname(os.path.dirname(paths[0])))]
