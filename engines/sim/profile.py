"""Hardware and model profiles for the sim engine's cost model (DESIGN §7.1).

A profile is a TOML data file in ``engines/sim/profiles/`` (shipped as package data). Its ``kind``
is ``"hardware"`` or ``"model"``, its name is the file's stem, and each number ``x`` may carry its
provenance in a neighbouring ``x_source`` string. Shipped profiles cite a source for every number.

Hardware figures are **per GPU**; ``tp`` says how many GPUs share one model replica. A
hardware profile may leave out the fields that refine the roofline (``step_overhead_s``,
``sequence_overhead_s``, ``overlap``); their defaults are the pure roofline.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

__all__ = [
    "HardwareProfile",
    "ModelProfile",
    "ProfileError",
    "ProfileNames",
    "list_profiles",
    "load_hardware",
    "load_model",
]

ProfileKind = Literal["hardware", "model"]

_SOURCE_SUFFIX = "_source"
_META_KEYS = frozenset({"kind", "description"})


class ProfileError(ValueError):
    """A profile is malformed: bad TOML, or a field missing, unknown, mistyped or out of range.

    Attributes:
        field_name: the offending field, or ``None`` when the problem is not one field's.
    """

    def __init__(self, message: str, *, field_name: str | None = None) -> None:
        super().__init__(message)
        self.field_name = field_name


@dataclass(frozen=True)
class HardwareProfile:
    """One serving node: ``tp`` identical GPUs running one tensor-parallel model replica.

    Args:
        name: registry name (the profile file's stem), e.g. ``"a6000-tp2"``.
        description: one line for humans.
        tp: tensor-parallel degree (GPUs per replica).
        memory_bytes_per_gpu: device memory of one GPU.
        memory_bandwidth_bytes_per_s: peak device-memory bandwidth of one GPU.
        peak_flops_per_s: dense bf16 tensor-core peak of one GPU (FP32 accumulate).
        host_link_bytes_per_s: effective host<->device copy bandwidth of one GPU's link, one
            direction.
        compute_efficiency: achieved fraction of ``peak_flops_per_s`` in prefill, in (0, 1].
        bandwidth_efficiency: achieved fraction of ``memory_bandwidth_bytes_per_s`` in decode,
            in (0, 1].
        reserve_bytes_per_gpu: memory kept from the KV pool (runtime, activations, headroom).
        step_overhead_s: seconds every forward step costs beyond its roofline (kernel
            launches, the framework's per-step work), >= 0.
        sequence_overhead_s: seconds each sequence in a step adds beyond its roofline
            (its own attention calls, its row's bookkeeping), >= 0.
        overlap: share of the shorter of a step's compute and memory times hidden under
            the longer, in [0, 1]: 1 is the roofline's perfect overlap (a GPU), 0 runs
            them one after the other.
        sources: field name -> where its number comes from.

    Raises:
        ProfileError: a field has the wrong type or is out of range.
    """

    name: str
    description: str
    tp: int
    memory_bytes_per_gpu: int
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    host_link_bytes_per_s: float
    compute_efficiency: float
    bandwidth_efficiency: float
    reserve_bytes_per_gpu: int
    step_overhead_s: float = 0.0
    sequence_overhead_s: float = 0.0
    overlap: float = 1.0
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _validate(self, _HARDWARE_RULES)
        object.__setattr__(self, "sources", dict(self.sources))


@dataclass(frozen=True)
class ModelProfile:
    """A dense decoder-only transformer's shapes (Hugging Face ``config.json`` names in brackets).

    Args:
        name: registry name (the profile file's stem), e.g. ``"qwen3-32b"``.
        description: one line for humans.
        num_layers: decoder layers [``num_hidden_layers``].
        num_attention_heads: query heads [``num_attention_heads``].
        num_kv_heads: key/value heads, GQA [``num_key_value_heads``].
        head_dim: channels per head [``head_dim``].
        hidden_size: residual width [``hidden_size``].
        num_params: total parameters, embeddings and LM head included.
        sources: field name -> where its number comes from.

    Raises:
        ProfileError: a field has the wrong type or is out of range.
    """

    name: str
    description: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    num_params: int
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _validate(self, _MODEL_RULES)
        object.__setattr__(self, "sources", dict(self.sources))


class _Rule(NamedTuple):
    integral: bool
    at_most_one: bool
    zero_ok: bool = False


_POSITIVE_INT = _Rule(integral=True, at_most_one=False)
_POSITIVE_NUMBER = _Rule(integral=False, at_most_one=False)
_FRACTION = _Rule(integral=False, at_most_one=True)
_NON_NEGATIVE = _Rule(integral=False, at_most_one=False, zero_ok=True)
_SHARE = _Rule(integral=False, at_most_one=True, zero_ok=True)

_HARDWARE_RULES: Mapping[str, _Rule] = {
    "tp": _POSITIVE_INT,
    "memory_bytes_per_gpu": _POSITIVE_INT,
    "memory_bandwidth_bytes_per_s": _POSITIVE_NUMBER,
    "peak_flops_per_s": _POSITIVE_NUMBER,
    "host_link_bytes_per_s": _POSITIVE_NUMBER,
    "compute_efficiency": _FRACTION,
    "bandwidth_efficiency": _FRACTION,
    "reserve_bytes_per_gpu": _POSITIVE_INT,
    "step_overhead_s": _NON_NEGATIVE,
    "sequence_overhead_s": _NON_NEGATIVE,
    "overlap": _SHARE,
}
_MODEL_RULES: Mapping[str, _Rule] = {
    "num_layers": _POSITIVE_INT,
    "num_attention_heads": _POSITIVE_INT,
    "num_kv_heads": _POSITIVE_INT,
    "head_dim": _POSITIVE_INT,
    "hidden_size": _POSITIVE_INT,
    "num_params": _POSITIVE_INT,
}


def _validate(profile: HardwareProfile | ModelProfile, rules: Mapping[str, _Rule]) -> None:
    for meta in ("name", "description"):
        if not isinstance(getattr(profile, meta), str):
            raise ProfileError(f"field {meta!r} must be a string", field_name=meta)
    for name, rule in rules.items():
        _check_number(name, getattr(profile, name), rule)


def _check_number(name: str, value: object, rule: _Rule) -> None:
    wanted = int if rule.integral else (int, float)
    if isinstance(value, bool) or not isinstance(value, wanted):
        kind = "an integer" if rule.integral else "a number"
        raise ProfileError(f"field {name!r} must be {kind}, got {value!r}", field_name=name)
    low = value < 0 if rule.zero_ok else value <= 0
    if low or (rule.at_most_one and value > 1):
        if rule.at_most_one:
            bounds = "in [0, 1]" if rule.zero_ok else "in (0, 1]"
        else:
            bounds = ">= 0" if rule.zero_ok else "> 0"
        raise ProfileError(f"field {name!r} must be {bounds}, got {value!r}", field_name=name)


_P = TypeVar("_P", HardwareProfile, ModelProfile)


class ProfileNames(NamedTuple):
    """The shipped profiles' names, sorted, by kind."""

    hardware: tuple[str, ...]
    model: tuple[str, ...]


def list_profiles() -> ProfileNames:
    """List the shipped profiles by kind.

    Raises:
        ProfileError: a shipped profile file is not valid TOML or has no valid ``kind``.
    """
    by_kind: dict[str, list[str]] = {"hardware": [], "model": []}
    for name, resource in sorted(_shipped().items()):
        origin = _origin(resource)
        kind = _parse(resource.read_text(encoding="utf-8"), origin).get("kind")
        if kind not in by_kind:
            raise ProfileError(
                f"{origin}: field 'kind' must be 'hardware' or 'model', got {kind!r}",
                field_name="kind",
            )
        by_kind[kind].append(name)
    return ProfileNames(hardware=tuple(by_kind["hardware"]), model=tuple(by_kind["model"]))


def load_hardware(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """Load a hardware profile by registry name (``"a6000-tp2"``) or from a TOML file.

    Args:
        name_or_path: a shipped profile's name, or a path (a ``PathLike``, or a string ending in
            ``.toml``) to a profile file.

    Raises:
        ValueError: unknown name (the message lists the known ones).
        ProfileError: the file is malformed; the message names the file, field and line.
    """
    return _load(name_or_path, HardwareProfile)


def load_model(name_or_path: str | os.PathLike[str]) -> ModelProfile:
    """Load a model profile by registry name (``"qwen3-32b"``) or from a TOML file.

    Args:
        name_or_path: a shipped profile's name, or a path (a ``PathLike``, or a string ending in
            ``.toml``) to a profile file.

    Raises:
        ValueError: unknown name (the message lists the known ones).
        ProfileError: the file is malformed; the message names the file, field and line.
    """
    return _load(name_or_path, ModelProfile)


def _shipped() -> dict[str, Any]:
    directory = resources.files(__package__).joinpath("profiles")
    return {
        entry.name.removesuffix(".toml"): entry
        for entry in directory.iterdir()
        if entry.name.endswith(".toml")
    }


def _load(name_or_path: str | os.PathLike[str], cls: type[_P]) -> _P:
    kind = _kind_of(cls)
    if isinstance(name_or_path, os.PathLike) or name_or_path.endswith(".toml"):
        path = Path(name_or_path)
        return _from_text(path.read_text(encoding="utf-8"), str(path), path.stem, cls)
    known: tuple[str, ...] = getattr(list_profiles(), kind)
    if name_or_path not in known:
        raise ValueError(
            f"unknown {kind} profile {name_or_path!r}; known {kind} profiles: {', '.join(known)}"
        )
    resource = _shipped()[name_or_path]
    return _from_text(resource.read_text(encoding="utf-8"), _origin(resource), name_or_path, cls)


def _kind_of(cls: type[HardwareProfile | ModelProfile]) -> ProfileKind:
    return "hardware" if cls is HardwareProfile else "model"


def _origin(resource: Any) -> str:
    return f"profiles/{resource.name}"


def _parse(text: str, origin: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ProfileError(f"{origin}: invalid TOML: {error}") from error


def _from_text(text: str, origin: str, name: str, cls: type[_P]) -> _P:
    try:
        values, sources = _split(_parse(text, origin), cls)
        return cls(name=name, sources=sources, **values)
    except ProfileError as error:
        if error.field_name is None:
            raise
        where = _line_of(text, error.field_name)
        raise ProfileError(f"{origin}{where}: {error}", field_name=error.field_name) from None


def _split(
    data: dict[str, Any], cls: type[HardwareProfile | ModelProfile]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Check the keys of a parsed profile; return (constructor values, sources)."""
    kind = _kind_of(cls)
    if data.get("kind") != kind:
        raise ProfileError(
            f"field 'kind' must be {kind!r}, got {data.get('kind')!r}", field_name="kind"
        )
    expected = {f.name for f in fields(cls)} - {"name", "sources"}
    optional = {f.name for f in fields(cls) if f.default is not MISSING}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, value in data.items():
        target = key.removesuffix(_SOURCE_SUFFIX)
        if key.endswith(_SOURCE_SUFFIX) and target in expected - _META_KEYS:
            if not isinstance(value, str):
                raise ProfileError(f"field {key!r} must be a string", field_name=key)
            sources[target] = value
        elif key in expected:
            values[key] = value
        elif key != "kind":
            raise ProfileError(f"unknown field {key!r} in a {kind} profile", field_name=key)
    missing = sorted(expected - optional - values.keys())
    if missing:
        raise ProfileError(f"missing field {missing[0]!r}", field_name=missing[0])
    return values, sources


def _line_of(text: str, key: str) -> str:
    match = re.search(rf"^[ \t]*{re.escape(key)}[ \t]*=", text, flags=re.MULTILINE)
    return "" if match is None else f":{text.count(chr(10), 0, match.start()) + 1}"
