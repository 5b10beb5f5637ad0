"""GPU presets and simulated-fleet files: node specs by name instead of by a dozen numbers.

The presets are *relative* figures for an 8B-class model, shaped like the public ratios between
the cards (decode is memory-bandwidth bound, prefill compute bound; the KV pool is what is left of
the card's memory after the weights). They are not vendor claims and not measurements of any real
server: ``h100`` is the unit, the others are scaled from it. Explicit numbers in a fleet file
override any preset field.

A simulated-fleet file (YAML or JSON) is ``{"model": NAME?, "nodes": [NODE, ...]}``; a NODE is
``{"name": ..., "preset": "h100" | "a100" | "l4" | "t4", "models": [...]?, <NodeSpec fields>,
<BatchSpec fields>}``. Unknown keys are refused with :class:`ValueError` naming the node and key.

Named fleets need no file: they are one table, :data:`FLEETS` (name → ``"module:attr"``, an
:class:`inferlb.plugins.Table`), and a fleet of your own is named by its ``"module:attr"``; either
target is a function ``(models: list[str]) -> list[NodeSpec]``. :func:`fleet_specs` takes a name
from the table first, then an existing file, then a ``module:attr`` (a
:class:`~inferlb.errors.PluginError` when it does not load), and reads anything else as a file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from inferlb.plugins import Table, is_target
from inferlb.simulator.disagg import KVTransferSpec
from inferlb.simulator.spec import BatchSpec, FaultSpec, GpuSpec, NodeSpec

__all__ = ["FLEETS", "PRESETS", "SIM_MODEL", "Preset", "cli_specs", "fleet_specs", "is_named_fleet", "load_sim_fleet",
           "preset_spec", "spec_from_mapping"]

SIM_MODEL = "sim-llm"
_EMBED = "sim-embed"

# The unit (``h100``): an 8B-class model in bf16. 10 ms per decode step at batch 1, +0.1 ms per
# running sequence, +0.2 µs per context token read by attention, 30 µs per prefilled token.
_STEP_BASE_S = 0.010
_STEP_PER_SEQ_S = 0.0001
_STEP_PER_KV_TOKEN_S = 2e-7
_PREFILL_S_PER_TOKEN = 0.00003


@dataclass(frozen=True, slots=True)
class Preset:
    """Relative speed (decode), relative prefill speed, KV-cache tokens, batch cap, GPU reading."""

    decode_speed: float
    prefill_speed: float
    kv_tokens: int
    max_num_seqs: int
    gpu: GpuSpec

    def batch_spec(self, **over: Any) -> BatchSpec:
        base = BatchSpec(
            kv_tokens=self.kv_tokens, max_num_seqs=self.max_num_seqs,
            step_base_s=_STEP_BASE_S / self.decode_speed, step_per_seq_s=_STEP_PER_SEQ_S / self.decode_speed,
            step_per_kv_token_s=_STEP_PER_KV_TOKEN_S / self.decode_speed,
            prefill_s_per_token=_PREFILL_S_PER_TOKEN / self.prefill_speed)
        return dataclasses.replace(base, **over)


PRESETS: dict[str, Preset] = {
    "h100": Preset(1.0, 1.0, 65_536, 256, GpuSpec("h100-like (simulated)", 81_559, 0.9, 90, 700, 33, 76)),
    "a100": Preset(0.6, 0.35, 49_152, 256, GpuSpec("a100-like (simulated)", 81_920, 0.9, 60, 400, 32, 72)),
    "l4": Preset(0.35, 0.12, 12_288, 128, GpuSpec("l4-like (simulated)", 23_034, 0.9, 16, 72, 30, 70)),
    "t4": Preset(0.2, 0.07, 6_144, 64, GpuSpec("t4-like (simulated)", 15_360, 0.9, 10, 70, 30, 72)),
}

_BATCH_KEYS = frozenset(f.name for f in dataclasses.fields(BatchSpec))
_NODE_KEYS = frozenset(f.name for f in dataclasses.fields(NodeSpec)) - {"batching", "faults", "gpu", "name",
                                                                          "models", "preset"}


def preset_spec(name: str, preset: str, models: list[str] | None = None, **over: Any) -> NodeSpec:
    """A batching node from ``preset`` (see :data:`PRESETS`); ``over`` sets NodeSpec or BatchSpec fields."""
    p = PRESETS.get(preset)
    if p is None:
        raise ValueError(f"node {name!r}: unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    batch_over = {k: v for k, v in over.items() if k in _BATCH_KEYS}
    node_over = {k: v for k, v in over.items() if k not in _BATCH_KEYS}
    unknown = set(node_over) - _NODE_KEYS - {"faults"}
    if unknown:
        raise ValueError(f"node {name!r}: unknown key(s) {', '.join(sorted(unknown))}")
    batch = p.batch_spec(**batch_over)
    faults = node_over.pop("faults", None)
    if isinstance(faults, Mapping):
        faults = FaultSpec.from_mapping(faults)
    # Legacy timing fields mirror the engine so embeddings / v2 infer (fixed latency) scale too.
    kw: dict[str, Any] = {"base_ttft_s": batch.step_base_s, "prefill_s_per_token": batch.prefill_s_per_token,
                          "tpot_s": batch.step_base_s, "max_concurrency": 4096, "default_output_tokens": 64}
    kw.update(node_over)
    if faults is not None:
        kw["faults"] = faults
    return NodeSpec(name=name, models=list(models or [SIM_MODEL, _EMBED]), batching=batch, gpu=p.gpu,
                    preset=preset, **kw)


def spec_from_mapping(raw: Mapping[str, Any], default_models: list[str] | None = None) -> NodeSpec:
    """One node of a simulated-fleet file; ``ValueError`` names the node and the bad key."""
    d = dict(raw)
    name = d.pop("name", None)
    if not isinstance(name, str) or not name:
        raise ValueError("every node needs a name")
    models = d.pop("models", None) or default_models
    preset = d.pop("preset", None)
    try:
        if isinstance(d.get("kv_transfer"), Mapping):   # {bytes_per_token, link_bytes_per_s, latency_s}
            d["kv_transfer"] = KVTransferSpec(**d["kv_transfer"])
        if preset is not None:
            return preset_spec(name, str(preset), models, **d)
        batch = {k: d.pop(k) for k in list(d) if k in _BATCH_KEYS}
        unknown = set(d) - _NODE_KEYS - {"faults"}
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(sorted(unknown))}")
        if "faults" in d and isinstance(d["faults"], Mapping):
            d["faults"] = FaultSpec.from_mapping(d["faults"])
        return NodeSpec(name=name, models=list(models or [SIM_MODEL, _EMBED]),
                        batching=BatchSpec(**batch) if batch else None, **d)
    except TypeError as exc:
        raise ValueError(f"node {name!r}: {exc}") from exc
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith("node ") else f"node {name!r}: {msg}") from exc


def _hetero4(models: list[str]) -> list[NodeSpec]:
    """Mixed speeds and KV sizes: one of each preset."""
    return [preset_spec(f"{p}-0", p, models) for p in ("h100", "a100", "l4", "t4")]


def _uniform4(models: list[str]) -> list[NodeSpec]:
    return [preset_spec(f"a100-{i}", "a100", models) for i in range(4)]


def _large16(models: list[str]) -> list[NodeSpec]:
    """16 ``a100`` nodes with room for 64+ long streams each: the fleet of the emulator-cost
    measurement (16 nodes × 64 running streams), where equal nodes keep the streams even."""
    return [preset_spec(f"a100-{i}", "a100", models, kv_tokens=131_072) for i in range(16)]


def _cache4(models: list[str]) -> list[NodeSpec]:
    """4 ``a100`` nodes with a prefix cache each (:mod:`.prefix_cache`): the affinity benchmark's."""
    return [preset_spec(f"a100-{i}", "a100", models, prefix_cache=True) for i in range(4)]


_S = "inferlb.simulator.presets"
FLEETS = Table("simulated fleet", {
    "hetero4": f"{_S}:_hetero4",
    "cache4": f"{_S}:_cache4",
    "uniform4": f"{_S}:_uniform4",
    "large16": f"{_S}:_large16",
})


def is_named_fleet(name: str) -> bool:
    """Whether :func:`fleet_specs` takes ``name`` as a fleet from code (a :data:`FLEETS` name, or a
    ``module:attr`` that is not an existing file) rather than a fleet file's path."""
    return name in FLEETS or (is_target(name) and not Path(name).exists())


def fleet_specs(name: str, models: list[str] | None = None) -> list[NodeSpec]:
    """A named fleet (:data:`FLEETS`, or ``module:attr`` of your own: PluginError when it does not
    load) or a fleet file path (ValueError for anything wrong in it)."""
    ms = list(models or [SIM_MODEL, _EMBED])
    if is_named_fleet(name):
        make: Callable[[list[str]], list[NodeSpec]] = FLEETS.load(name)
        return make(ms)
    return load_sim_fleet(Path(name), ms)


def load_sim_fleet(path: Path, models: list[str] | None = None) -> list[NodeSpec]:
    """Read a simulated-fleet file (YAML or JSON); ``ValueError`` for anything wrong in it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror}); named fleets: {', '.join(FLEETS)}") from exc
    raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list) or not raw["nodes"]:
        raise ValueError(f"{path}: expected a mapping with a non-empty 'nodes' list")
    extra = set(raw) - {"nodes", "model", "models"}
    if extra:
        raise ValueError(f"{path}: unknown key(s) {', '.join(sorted(extra))}")
    default = raw.get("models") or ([raw["model"], _EMBED] if raw.get("model") else models)
    specs = []
    for i, node in enumerate(raw["nodes"]):
        if not isinstance(node, dict):
            raise ValueError(f"{path}: nodes[{i}] must be a mapping")
        try:
            specs.append(spec_from_mapping(node, default))
        except ValueError as exc:
            raise ValueError(f"{path}: nodes[{i}]: {exc}") from exc
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: node names must be unique")
    return specs


def cli_specs(fleet: str | None, *, on_kv_full: Literal["preempt", "oom"] | None = None,
              stream_interval: int | None = None,
              get_load: Literal["sglang", "vllm-router"] | None = None) -> list[NodeSpec] | None:
    """The nodes ``inferlb sim`` runs: ``fleet`` (a name or file; ``None``: the demo nodes) with
    every node's ``on_kv_full`` / ``stream_interval`` / ``get_load`` overridden when given."""
    if fleet is None and on_kv_full is None and stream_interval is None and get_load is None:
        return None
    if fleet is not None:
        specs = fleet_specs(fleet)
    else:
        from inferlb.simulator.spec import demo_specs

        specs = demo_specs()
    out = []
    for s in specs:
        if on_kv_full is not None and s.batching is not None:
            s = dataclasses.replace(s, batching=dataclasses.replace(s.batching, on_kv_full=on_kv_full))
        if stream_interval is not None:
            s = dataclasses.replace(s, stream_interval=stream_interval)
        if get_load is not None:
            s = dataclasses.replace(s, get_load=get_load)
        out.append(s)
    return out
