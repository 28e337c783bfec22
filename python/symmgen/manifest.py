"""manifest.py: the manifest.json that symmgen writes, read in Python: each
variant's fields (hidden, topk, experts, dtype, layout, capacity, sms, ...),
its buffer regions and which arguments live in symmetric memory.

libsymm checks the same file again when a variant is opened from it
(symm_variant_open); this reader serves what Python needs before that:
shapes and dtypes to check arguments against, and region offsets to view
the variant's buffers as tensors. Nothing here needs torch."""

import json
import os

from ._lib import DTYPE_SIZES, FP8_BLOCK

# The manifest format this package reads (SYMM_MANIFEST_FORMAT).
FORMAT = 2

_INT_FIELDS = ("hidden", "topk", "experts", "world", "local_experts", "max_tokens", "capacity",
               "worst_capacity", "align", "sms", "symmetric_bytes", "scratch_bytes")
_STR_FIELDS = ("name", "dtype", "combine_dtype", "layout")


class ManifestError(ValueError):
    """A manifest that cannot be read, or that lacks what is asked of it."""


class Variant:
    """One variant of a manifest. Attributes: name, hidden, topk, experts,
    world, local_experts, max_tokens, dtype, combine_dtype ("bf16", "fp16",
    "fp32", "fp8_e4m3"), layout ("rank" or "expert"), weights (bool),
    combine ("push", "pull" or "auto": both forms, by where y lies, layout
    rank only), combine_order ("rank" or "k": the order in
    which layout expert's combine sums), capacity, worst_capacity, align,
    sms, symmetric_bytes, scratch_bytes, regions ({name: (offset, bytes,
    symmetric)}), arguments (the manifest's per-operation argument lists),
    fields (every member as written) and manifest_path."""

    def __init__(self, fields, manifest_path):
        where = f"{manifest_path}: variant {fields.get('name', '?')}"
        for key in _INT_FIELDS:
            value = fields.get(key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ManifestError(f"{where}: field {key}: got {value!r}, expected an integer")
            setattr(self, key, value)
        for key in _STR_FIELDS:
            value = fields.get(key)
            if not isinstance(value, str):
                raise ManifestError(f"{where}: field {key}: got {value!r}, expected a string")
            setattr(self, key, value)
        for key in ("dtype", "combine_dtype"):
            if getattr(self, key) not in DTYPE_SIZES:
                raise ManifestError(f"{where}: field {key}: got {getattr(self, key)!r}, expected one of "
                                    f"{', '.join(DTYPE_SIZES)}")
        if self.layout not in ("rank", "expert"):
            raise ManifestError(f"{where}: field layout: got {self.layout!r}, expected rank or expert")
        self.weights = bool(fields.get("weights"))
        self.combine = fields.get("combine", "push")
        if self.combine not in ("push", "pull", "auto"):
            raise ManifestError(f"{where}: field combine: got {self.combine!r}, expected push, pull or auto")
        if self.combine == "auto" and self.layout != "rank":
            raise ManifestError(f"{where}: field combine: got 'auto', expected push or pull with layout expert "
                                f"(auto is for layout rank only)")
        # Manifests of a libsymm before the choice existed summed layout
        # expert's combine in k order; layout rank has one order.
        self.combine_order = fields.get("combine_order", "k" if self.layout == "expert" else "rank")
        self.regions = {r["name"]: (r["offset"], r["bytes"], bool(r["symmetric"]))
                        for r in fields.get("regions", [])}
        # Across hosts: a companion's host count and parent, a variant's
        # companions ({hosts: name}).
        self.hosts = fields.get("hosts", 0)
        self.companion_of = fields.get("companion_of")
        self.companions = {c["hosts"]: c["name"] for c in fields.get("companions", [])}
        self.arguments = fields.get("arguments", {})
        self.fields = dict(fields)
        self.manifest_path = manifest_path

    @property
    def pull(self):
        """Whether combine reads the peers' y (combine = "pull"): y must then
        lie in the variant's symmetric buffer."""
        return self.combine == "pull"

    @property
    def auto(self):
        """Whether combine has both forms (combine = "auto"): it pulls in a
        call whose y lies in the variant's symmetric buffer (region y, or
        recv_x) and pushes in any other; every rank must place y alike."""
        return self.combine == "auto"

    @property
    def has_y_region(self):
        """Whether the variant has a place for y in its symmetric buffer
        (region y: combine = "pull" or "auto")."""
        return self.combine in ("pull", "auto")

    @property
    def scale_cols(self):
        """fp8 scales per row (hidden / 128); 0 for the other dtypes."""
        return self.hidden // FP8_BLOCK if self.dtype == "fp8_e4m3" else 0

    def symmetric_arguments(self, op):
        """The names of op's ("dispatch", "combine", "results") arguments that
        the manifest declares symmetric."""
        return [a["name"] for a in self.arguments.get(op, []) if a.get("symmetric")]

    def __repr__(self):
        return (f"Variant({self.name}: hidden {self.hidden}, topk {self.topk}, experts {self.experts}, "
                f"world {self.world}, max_tokens {self.max_tokens}, {self.dtype} -> {self.combine_dtype}, "
                f"layout {self.layout}, capacity {self.capacity}, combine {self.combine})")


class Manifest:
    """A manifest.json: `path`, `spec`, `symmgen` (its version), `variants`
    ({name: Variant}, in the file's order) and `names`."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise ManifestError(f"{path}: cannot read the manifest: {e.strerror}") from None
        except ValueError as e:
            raise ManifestError(f"{path}: not a JSON manifest: {e}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ManifestError(f"{path}: format {got!r}: this package reads manifest format {FORMAT}")
        self.spec = data.get("spec")
        self.symmgen = data.get("symmgen")
        variants = data.get("variants")
        if not isinstance(variants, list):
            raise ManifestError(f"{path}: member variants: expected an array of variants")
        self.variants = {}
        for fields in variants:
            v = Variant(fields, self.path)
            self.variants[v.name] = v
        self.names = list(self.variants)

    def variant(self, name=None):
        """The variant called name; without a name, the only one (an error
        naming them when there are several)."""
        if name is None:
            if len(self.variants) != 1:
                raise ManifestError(f"{self.path}: {len(self.variants)} variants ({', '.join(self.names)}): "
                                    f"name the one to use")
            return next(iter(self.variants.values()))
        try:
            return self.variants[name]
        except KeyError:
            raise ManifestError(f"{self.path}: no variant {name!r}: the manifest has "
                                f"{', '.join(self.names) or 'none'}") from None


def load(path):
    """Read the manifest at path (a file, or a directory holding manifest.json)."""
    if os.path.isdir(path):
        path = os.path.join(path, "manifest.json")
    return Manifest(path)
