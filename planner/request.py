"""`PlanRequest`: everything a plan is made under, resolved once and passed unchanged to the planner.

A request is built in one place (`PlanRequest.make`): the hardware name becomes the profile
(`planner.hardware.resolve_hardware`), the target name the `Target` (`planner.targets.get_target`), and
the profile is priced as that target compiles (`Target.profile`: what it cannot lower priced out) —
each exactly once. The backend builds one request per compile from its options
(`wancompile.planning.request_for`); the library entry points (`planner.plan_graph`,
`planner.cfg.plan_dit`, `planner.vae_plan.plan_vae`) build one from their arguments. Below that, the
families (`planner.families`) read the request and derive variants of it (another mesh, its links, batch
axes: `PlanRequest.variant`) without resolving anything again.

Fields (the options of the same names, docs/usage.md):

- ``mesh``: the logical mesh (axes of size 1 are ignored); ``target``: the partitioner (`planner.targets`);
  ``hw``: the hardware profile as ``target`` prices it (``hardware``: as named, for reports of its own figures).
- ``memory_gb``: per-device budget (None: the profile's DRAM); ``weight_sets``: weight sets resident per
  device (2 for both A14B experts).
- ``cfg_parallel``: ``auto`` / ``on`` / ``off`` for a batch-2 DiT graph (`planner.cfg`); ``cfg_axes``: the
  mesh axes a CFG split may halve (None: the major-most of size > 1); ``cfg_pair_splittable``: the caller
  can run a batch-2 CFG pair as two batch-1 forwards, so ``auto`` may decide ``sequential`` (a decision
  in the returned plan: `planner.plan.Plan.runs_cfg_sequentially`).
- ``values``: example sizes for symbolic dims; ``num_blocks``: the blocks of the whole model when the
  graph holds fewer; ``model``: the name the plan carries (empty: the graph's); ``time_limit_s``: the
  solver's limit (None: the family's default).
- ``pad_heads``: {attention module: heads} -> the planner graph with those heads zero-padded
  (`planner.padding.PadHeads`); None: no padded options.
- DiT search restrictions (`planner.autoplan.plan_graph`): ``only``, ``preset``, ``sequence_parallel``,
  ``stream_layouts``, ``batch_axes``, ``fsdp_blocks``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec
from planner.plan import PlanError
from planner.targets import Target

if TYPE_CHECKING:
    from planner.padding import PadHeads
    from planner.plan import Plan


@dataclass(frozen=True)
class PlanRequest:
    mesh: MeshSpec
    target: Target
    hw: HardwareProfile  # as `target` prices it (Target.profile applied once, by `make`)
    memory_gb: Optional[float] = None
    weight_sets: int = 1
    cfg_parallel: str = "auto"
    cfg_axes: Optional[tuple[str, ...]] = None
    cfg_pair_splittable: bool = False
    values: Mapping[str, int] = field(default_factory=dict)
    num_blocks: Optional[int] = None
    model: str = ""
    time_limit_s: Optional[float] = None
    pad_heads: Optional["PadHeads"] = field(default=None, compare=False)
    # DiT search restrictions (planner.autoplan.plan_graph documents each)
    only: Mapping[str, str] = field(default_factory=dict)
    preset: str = "auto"
    sequence_parallel: bool = True
    stream_layouts: bool = True
    batch_axes: tuple[str, ...] = ()
    fsdp_blocks: Optional[Mapping[str, int]] = None
    # the profile as named, before the target prices anything out (for reports of the hardware's own figures)
    hardware: Optional[HardwareProfile] = field(default=None, compare=False, repr=False)

    @classmethod
    def make(
        cls,
        mesh: MeshSpec,
        hardware: Union[str, HardwareProfile, None] = None,
        target: Union[str, Target, None] = None,
        *,
        on_target_mesh: bool = False,
        **fields: Any,
    ) -> "PlanRequest":
        """The request for `mesh`: `hardware` a profile name (None: the mesh's system,
        `planner.hardware.default_hardware`) or profile, `target` a target name (None: ``gspmd``) or
        `Target`; `fields` as the class's. `on_target_mesh`: plan on the mesh the target's partitioner
        accepts for `mesh` (`Target.runs_on`), as the backend compiles. The one place a hardware name or a
        target name is resolved."""
        from planner.hardware import resolve_hardware
        from planner.targets import DEFAULT, get_target

        spec = target if isinstance(target, Target) else get_target(target or DEFAULT)
        mesh = spec.runs_on(mesh) if on_target_mesh else mesh
        named = resolve_hardware(hardware, mesh)
        hw = spec.profile(named)  # what the target cannot lower, priced out
        if "cfg_parallel" in fields:
            fields["cfg_parallel"] = normalize_mode(fields["cfg_parallel"])
        for name in ("values", "only"):
            if name in fields:
                fields[name] = dict(fields[name] or {})
        if "batch_axes" in fields:
            fields["batch_axes"] = tuple(fields["batch_axes"])
        request = cls(mesh, spec, hw, hardware=named, **fields)
        if request.weight_sets < 1:
            raise PlanError(
                f"weight_sets must be at least 1 (weight sets resident per device), got {request.weight_sets}"
            )
        return request

    @classmethod
    def for_plan(cls, plan: "Plan", hardware: Union[str, HardwareProfile, None] = None) -> "PlanRequest":
        """The request a made plan answers, as far as it records one: its mesh, its hardware (or `hardware`),
        its target. For reading a plan back (pins, collectives, traces) where no request is at hand."""
        return cls.make(plan.mesh, hardware or plan.hardware or None, plan.target or None)

    def variant(self, **changes: Any) -> "PlanRequest":
        """This request with `changes` (fields: another mesh with its links, batch axes, ...); nothing is
        resolved again."""
        return replace(self, **changes)

    @property
    def budget_bytes(self) -> float:
        """The per-device memory budget: ``memory_gb``, else the profile's DRAM."""
        return self.memory_gb * 1e9 if self.memory_gb is not None else float(self.hw.dram_bytes)


def normalize_mode(value: Union[str, bool, None]) -> str:
    """``auto`` / ``on`` / ``off`` from a mode name or a boolean (None = auto)."""
    if value is None:
        return "auto"
    if value is True:
        return "on"
    if value is False:
        return "off"
    text = str(value).strip().lower()
    aliases = {
        "auto": "auto",
        "on": "on",
        "true": "on",
        "1": "on",
        "yes": "on",
        "off": "off",
        "false": "off",
        "0": "off",
        "no": "off",
    }
    if text not in aliases:
        raise PlanError(f"cfg_parallel must be auto, on (true) or off (false); got {value!r}")
    return aliases[text]
