"""The backend's options (DESIGN.md §2), parsed once into a frozen, validated `Options`.

Sources, later ones winning: defaults, ``WANCOMPILE_<NAME>`` environment variables, the
``options={...}`` dict given to ``torch.compile``. Unknown keys are errors that list the known ones.

    torch.compile(m, backend="wan_autoshard", options={"mesh": "8x4", "hardware": "wh-galaxy"})
    WANCOMPILE_MESH=2x4 WANCOMPILE_VERIFY=1 python run.py
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from planner.errors import Error
from planner.mesh import MeshError, MeshSpec, parse_mesh
from rewrites import PASS_NAMES as REWRITE_NAMES

if TYPE_CHECKING:
    from planner.targets import Target

ENV_PREFIX = "WANCOMPILE_"
# Plans made by rule instead of by the solver; `plan="tt-xla"` runs the seed's hand plan.
BUILTIN_PLANS = ("tt-xla",)


class OptionsError(Error, ValueError):
    """A bad backend option; the message names the option and the fix."""


@dataclass(frozen=True)
class Options:
    # Device mesh: "8x4", (8, 4), a MeshSpec, or a torch_xla Mesh. None: all devices on one "model" axis.
    mesh: Optional[MeshSpec] = None
    # The torch_xla Mesh object when one was given (device order taken from it).
    xla_mesh: Any = field(default=None, compare=False, repr=False)
    # Hardware profile name for the cost model (e.g. "wh-galaxy"); None: the planner's default.
    hardware: Optional[str] = None
    # Write plan.json (and the planner's other dumps) here.
    dump_dir: Optional[Path] = None
    # Run this saved plan.json instead of solving, or a built-in plan by name (BUILTIN_PLANS).
    plan: Optional[Union[Path, str]] = None
    # Per-device memory budget in GB, overriding the hardware profile's.
    memory_gb: Optional[float] = None
    # On the first call, compare against the same graph unsharded and raise on mismatch.
    verify: bool = False
    # Graph rewrites to run before planning: a tuple of names from REWRITE_NAMES; None (not given): those of the saved
    # plan it runs, else the target's default (`rewrites_for`: tt-mlir runs every pass, gspmd none).
    rewrites: Optional[tuple[str, ...]] = None
    # Weight sets resident per device that the memory budget must hold (2 for both Wan 2.2 A14B experts).
    weight_sets: int = 1
    # CFG parallel for batch-2 DiT graphs (planner.cfg): "auto" (the cost model decides), "on", "off".
    cfg_parallel: str = "auto"
    # The caller can run a batch-2 CFG pair as two batch-1 forwards (compile_pipeline's CFG wrapper sets it under
    # cfg_parallel="auto"; internal, `_INTERNAL`): the planner may then decide ``sequential`` (planner.cfg), and
    # the backend answers with `planner.cfg.CfgSequential` instead of compiling the batch-2 graph.
    cfg_pair_splittable: bool = False
    # The partitioner the plan is for (planner.targets): "gspmd" or "tt-mlir"; None: `resolved_target`.
    target: Optional[str] = None
    # Compute parameter-only subgraphs (packed weights) once per parameter version (wancompile.fold); False keeps
    # them in the program, recomputed per call (for measuring what folding saves).
    fold_parameters: bool = True
    # Hand the target's compiler the ops it runs as fused kernels as composites (`wancompile.composites`; tt-mlir:
    # attention, LayerNorm, RMSNorm, GELU -> one TTNN kernel each); False exports them decomposed. gspmd: no effect.
    fused_ops: bool = True
    # Where plans (by graph hash) and XLA's compiled programs persist across processes (wancompile.cache), e.g.
    # "~/.cache/wancompile"; None (the default), "off" or "": nothing persists.
    cache_dir: Optional[Path] = None

    @property
    def resolved_target(self) -> str:
        """The target option, else tt-mlir for a Tenstorrent `hardware` option, else gspmd."""
        from planner.targets import default_target

        return self.target or default_target(self.hardware)

    def rewrites_for(self, target: "Target", saved: Optional[tuple[str, ...]] = None) -> tuple[tuple[str, ...], dict]:
        """The passes a compile for `target` runs, in pass order, and why each (pass -> reason, as plan.json's
        ``rewrites[].why``): the ``rewrites`` option when given, else those a saved plan it runs was made with
        (`saved`: its locations name ops of that rewritten graph), else the target's default
        (`planner.targets.Target.default_rewrites`)."""
        if self.rewrites is not None:
            return self.rewrites, {n: "asked for (the rewrites option)" for n in self.rewrites}
        if saved is not None:
            return saved, {n: "the saved plan was made with it" for n in saved}
        default = target.default_rewrites
        names = tuple(n for n in REWRITE_NAMES if n in dict(default))
        return names, {n: f"{target.name}'s default: {why}" for n, why in default}

    @classmethod
    def from_user(
        cls, options: Optional[Mapping[str, Any]] = None, env: Optional[Mapping[str, str]] = None
    ) -> "Options":
        env = os.environ if env is None else env
        raw: dict[str, Any] = {}
        for key, value in env.items():
            if key.startswith(ENV_PREFIX) and key not in OTHER_ENV:
                name = key[len(ENV_PREFIX) :].lower()
                if name not in _KNOWN:
                    known = [ENV_PREFIX + k.upper() for k in sorted(_KNOWN)]
                    raise OptionsError(
                        f"unknown environment variable {key}{_did_you_mean(key, known)}; the {ENV_PREFIX}* variables "
                        f"are backend options: {', '.join(known)}. Unset it or fix its name"
                    )
                raw[name] = value
        for key, value in (options or {}).items():
            if key not in _KNOWN and key not in _INTERNAL:
                raise OptionsError(
                    f"unknown wan_autoshard option {key!r}{_did_you_mean(str(key), sorted(_KNOWN))}; known options: "
                    f"{', '.join(sorted(_KNOWN))}"
                )
            raw[key] = value
        return _parse(raw)


_KNOWN = frozenset(
    {
        "mesh",
        "axis_names",
        "hardware",
        "dump_dir",
        "plan",
        "memory_gb",
        "verify",
        "rewrites",
        "weight_sets",
        "cfg_parallel",
        "target",
        "fold_parameters",
        "fused_ops",
        "cache_dir",
    }
)
# Options a caller inside wancompile passes, not offered to users (nor read from the environment):
# compile_pipeline's CFG wrapper says it can run a CFG pair as two forwards (`Options.cfg_pair_splittable`).
_INTERNAL = frozenset({"cfg_pair_splittable"})
# WANCOMPILE_* variables that are not options (read by other parts of the project). Every other
# variable with the prefix is taken for a misspelt option and refused; add new ones here.
OTHER_ENV: frozenset[str] = frozenset({"WANCOMPILE_TT_PYTHON", "WANCOMPILE_TT_CACHE"})  # wancompile.tt.env


def _did_you_mean(name: str, known) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse(raw: dict[str, Any]) -> Options:
    axis_names = raw.get("axis_names")
    if isinstance(axis_names, str):
        axis_names = tuple(a.strip() for a in axis_names.split(",") if a.strip())
    mesh, xla_mesh = None, None
    if raw.get("mesh") is not None:
        value = raw["mesh"]
        if hasattr(value, "mesh_shape") and hasattr(value, "axis_names"):  # a torch_xla Mesh
            xla_mesh = value
            names = axis_names or tuple(value.axis_names or ())
            value = MeshSpec(
                tuple(int(n) for n in value.mesh_shape),
                tuple(names) if names else _default_names(len(value.mesh_shape)),
            )
        try:
            mesh = parse_mesh(value, axis_names)
        except MeshError as e:
            raise OptionsError(f"option 'mesh': {e}") from None
    elif axis_names is not None:
        raise OptionsError("option 'axis_names' needs a 'mesh' to name")

    memory_gb = raw.get("memory_gb")
    if memory_gb is not None:
        try:
            memory_gb = float(memory_gb)
        except (TypeError, ValueError):
            raise OptionsError(f"option 'memory_gb' must be a number of gigabytes, got {memory_gb!r}") from None
        if memory_gb <= 0:
            raise OptionsError(f"option 'memory_gb' must be positive, got {memory_gb}")

    verify = _parse_bool("verify", raw.get("verify", False))
    fold_parameters = _parse_bool("fold_parameters", raw.get("fold_parameters", True))
    cfg_pair_splittable = _parse_bool("cfg_pair_splittable", raw.get("cfg_pair_splittable", False))
    cache_dir = raw.get("cache_dir")
    cache_dir = None if cache_dir is None or str(cache_dir).strip().lower() in _FALSE | {"none"} else Path(cache_dir)
    cache_dir = cache_dir.expanduser() if cache_dir is not None else None

    plan = raw.get("plan")
    if plan is not None and str(plan) not in BUILTIN_PLANS:
        plan = Path(plan)
        if not plan.is_file():
            raise OptionsError(
                f"option 'plan': no file at {plan}; pass the path of a plan.json written by wancompile, "
                f"or a built-in plan: {', '.join(BUILTIN_PLANS)}"
            )

    weight_sets = raw.get("weight_sets", 1)
    try:
        ok = not isinstance(weight_sets, bool) and float(weight_sets) == int(weight_sets) and int(weight_sets) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise OptionsError(
            f"option 'weight_sets' must be an integer >= 1 (weight sets resident per device, e.g. 2 "
            f"for both Wan 2.2 experts), got {weight_sets!r}"
        )
    hardware = str(raw["hardware"]) if raw.get("hardware") else None
    if hardware is not None:
        _check_hardware(hardware, mesh)
    target = str(raw["target"]) if raw.get("target") else None
    if target is not None:
        from planner.targets import TARGETS

        if target not in TARGETS:
            raise OptionsError(
                f"option 'target': unknown partitioner {target!r}{_did_you_mean(target, sorted(TARGETS))}; choose "
                f"{' or '.join(TARGETS)} (gspmd: XLA on CPU/GPU/TPU; tt-mlir: Tenstorrent through tt-xla)"
            )

    return Options(
        mesh=mesh,
        xla_mesh=xla_mesh,
        hardware=hardware,
        dump_dir=Path(raw["dump_dir"]) if raw.get("dump_dir") else None,
        plan=plan,
        memory_gb=memory_gb,
        verify=verify,
        rewrites=parse_rewrites(raw.get("rewrites")),
        weight_sets=int(weight_sets),
        cfg_parallel=_parse_cfg(raw.get("cfg_parallel", "auto")),
        cfg_pair_splittable=cfg_pair_splittable,
        target=target,
        fold_parameters=fold_parameters,
        fused_ops=_parse_bool("fused_ops", raw.get("fused_ops", True)),
        cache_dir=cache_dir,
    )


def _parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() not in _TRUE | _FALSE:
            raise OptionsError(f"option {name!r} must be a boolean (1/0, true/false), got {value!r}")
        return value.lower() in _TRUE
    if not isinstance(value, bool):
        raise OptionsError(f"option {name!r} must be a boolean, got {value!r}")
    return value


def _parse_cfg(value: Any) -> str:
    from planner.cfg import normalize_mode
    from planner.plan import PlanError

    try:
        return normalize_mode(value)
    except PlanError:
        raise OptionsError(f"option 'cfg_parallel' must be 'auto', 'on'/True or 'off'/False, got {value!r}") from None


def _check_hardware(name: str, mesh: Optional[MeshSpec]) -> None:
    """A known profile, for a system at least as large as the mesh; a mesh of another shape is priced
    as part of the system (logged, not silent)."""
    import logging
    import math

    from planner.hardware import PROFILES

    if name not in PROFILES:
        raise OptionsError(
            f"option 'hardware': unknown profile {name!r}{_did_you_mean(name, sorted(PROFILES))}; "
            f"choose one of {', '.join(sorted(PROFILES))}"
        )
    native = PROFILES[name].mesh_shape
    if mesh is not None and mesh.size > math.prod(native):
        raise OptionsError(
            f"option 'hardware': {name} has {math.prod(native)} devices ({'x'.join(map(str, native))}) but mesh "
            f"{mesh} has {mesh.size}; choose a profile for a system that large"
        )
    if mesh is not None and tuple(mesh.shape) != tuple(native):
        logging.getLogger("wancompile").warning(
            "wan_autoshard: hardware %s's native mesh is %s; mesh %s is priced as part of it (its links per axis)",
            name,
            "x".join(map(str, native)),
            mesh,
        )


def _default_names(ndim: int) -> tuple[str, ...]:
    try:
        return parse_mesh((1,) * ndim).axis_names
    except MeshError as e:
        raise OptionsError(f"option 'mesh': {e}") from None


def parse_rewrites(value: Union[str, list, tuple, None]) -> Optional[tuple[str, ...]]:
    """Pass names from 'all', 'none', 'default' (None: the target's, `Options.rewrites_for`), a comma-separated
    string or a list."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == "default":
            return None
        if value.strip().lower() == "all":
            return REWRITE_NAMES
        if value.strip().lower() in ("none", ""):
            return ()
        value = [v.strip() for v in value.split(",") if v.strip()]
    names = tuple(value)
    bad = [n for n in names if n not in REWRITE_NAMES]
    if bad:
        raise OptionsError(
            f"option 'rewrites': unknown pass(es) {bad}; use 'all', 'none', 'default' (the target's), or names from "
            f"{list(REWRITE_NAMES)}"
        )
    return names
