"""``wancompile tt-check`` on a tiny model: a random-weight DiT (or VAE) compiled for ``target="tt-mlir"`` on
virtual CPU devices, run once for its numerics, and every program it wrote compiled through tt-mlir
(`wancompile.tt.check.check_compiled`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from planner.mesh import MeshSpec
from wancompile.tt import env
from wancompile.tt.check import ProgramCheck, _attrs, check_compiled


@dataclass(frozen=True)
class ModelCheck:
    """`check_model`'s result: the plan, the CPU numerics of the same pinned plan, one check per program."""

    plan_summary: str
    pins: int
    constraints: int
    pcc: float
    max_abs: float
    checks: tuple[ProgramCheck, ...]
    # eager in the model's dtype against eager fp32 (1.0 and 0 for fp32): the error the dtype itself costs
    eager_pcc: float = 1.0
    eager_max_abs: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.as_predicted and c.pins_clean for c in self.checks)

    def to_json(self) -> dict:
        return {
            "plan": self.plan_summary,
            **_attrs(self, "pins", "constraints", "pcc", "max_abs", "eager_pcc", "eager_max_abs", "ok"),
            "programs": [c.to_json() for c in self.checks],
        }


def check_model(
    model: str,
    mesh: MeshSpec,
    systems: Iterable[str],
    out_dir: Path,
    *,
    component: str = "transformer",
    plan: Optional[str] = None,
    memory_gb: Optional[float] = None,
    rewrites: str = "default",
    frames: int = 9,
    batch: int = 1,
    cfg_parallel: str = "auto",
    hardware: Optional[str] = None,
    t_chunk: Optional[int] = None,
    dtype: str = "float32",
    tightest: bool = False,
    unannotated: bool = False,
) -> ModelCheck:
    """Compile `model`'s `component` (a tiny random-weight config: ``tiny``, a Wan-family DiT of
    `wancompile.models.FAMILIES` such as ``wan-i2v`` or ``wan-ti2v`` with its example inputs, or a VAE) with ``target="tt-mlir"`` on
    ``mesh.size`` virtual CPU devices, run it once (numerics against eager fp32: the pinned plan on
    GSPMD), then compile every program the call wrote through tt-mlir for each system. `dtype`: the DiT
    as a pipeline loads it in that dtype (`wancompile.models.as_loaded`; inputs likewise), its numerics still
    against eager fp32. `tightest`: a DiT planned at the smallest budget the planner accepts on `mesh`
    (`MemoryBudgetError.need_gb`), as the fuzz's ``min`` cases. `unannotated`: each main program also compiled
    with its plan taken out, what the pins cost held per part (`parts.PinCost`). Starts the XLA runtime: call it in a process
    where it has not started."""
    import torch

    from planner.pins import pin_count
    from wancompile import runtime

    out_dir = Path(out_dir)
    env.require()
    for old in [*out_dir.glob("*.mlirbc"), *out_dir.glob("*.tt.mlir")]:  # a reused --out: this call's programs only
        old.unlink()
    runtime.configure(num_devices=mesh.size, dump_dir=out_dir / "hlo")
    from wancompile.programs import recent_programs
    from wancompile.verify import numerics

    options = {"mesh": str(mesh), "target": "tt-mlir", "dump_dir": str(out_dir), "rewrites": rewrites}
    options.update({k: v for k, v in (("plan", plan), ("memory_gb", memory_gb), ("hardware", hardware)) if v})
    if component == "vae":
        import wancompile.vae as wvae
        from wancompile.vae.configs import VAE_CONFIGS, build_vae

        vae = wvae.enable_full_t(build_vae(model), t_chunk=t_chunk)
        z_dim = VAE_CONFIGS[model]["z_dim"]
        z = torch.randn(1, z_dim, 3, 8, 8, generator=torch.Generator().manual_seed(0))
        # chunked-T decodes one graph per chunk shape (its driver loop stays in Python)
        compiled = torch.compile(vae.decode, backend="wan_autoshard", options=options, fullgraph=t_chunk is None)
        with torch.no_grad():
            out = compiled(z).sample
            eager = vae.decode(z).sample
    else:
        from wancompile.models import FAMILIES, as_loaded, build_family, build_transformer, transformer_inputs

        options["cfg_parallel"] = cfg_parallel
        if model in FAMILIES:  # a Wan-family DiT (wan-i2v, wan-ti2v, ...) with its own example inputs
            module, inputs = build_family(model)
        else:
            module = build_transformer(model)
            inputs = transformer_inputs(model, "tiny", frames, batch=batch)
        with torch.no_grad():
            eager = module(**inputs, return_dict=False)[0]  # fp32: the reference in every dtype
        if dtype != "float32":
            module = as_loaded(module, getattr(torch, dtype))
            inputs = {k: _cast(v, getattr(torch, dtype)) for k, v in inputs.items()}
        if tightest:
            options["memory_gb"] = _tightest(module, inputs, options)
        compiled = torch.compile(module, backend="wan_autoshard", options=options, fullgraph=True)
        with torch.no_grad():
            out = compiled(**inputs, return_dict=False)[0].float()
            if dtype != "float32":  # the error the dtype itself costs: eager in it, against eager fp32
                in_dtype = numerics(module(**inputs, return_dict=False)[0].float(), eager)
    result = numerics(out, eager)
    programs = [p for p in recent_programs() if p.stablehlo_sink is not None and p.stablehlo_sink.written]
    checks = check_compiled(programs, systems, out_dir, unannotated=unannotated)
    plan = programs[-1].plan
    eager_pcc, eager_max_abs = (
        (in_dtype.pcc, in_dtype.max_abs) if dtype != "float32" and component != "vae" else (1.0, 0.0)
    )
    return ModelCheck(
        plan.summary(),
        pin_count(plan),
        len(plan.activations),
        result.pcc,
        result.max_abs,
        tuple(checks),
        eager_pcc,
        eager_max_abs,
    )


def _cast(value, dtype):
    """A floating-point input tensor in `dtype`; anything else as it is."""
    import torch

    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _tightest(module, inputs: dict, options: dict) -> float:
    """The smallest per-device budget (GB) the planner accepts for `module` under `options`: what it names
    when asked to plan within none."""
    import torch

    from planner.errors import MemoryBudgetError

    try:
        with torch.no_grad():
            torch.compile(module, backend="wan_autoshard", options={**options, "memory_gb": 1e-9}, fullgraph=True)(
                **inputs, return_dict=False
            )
    except Exception as e:  # the planner's error, out of dynamo's BackendCompilerFailed
        inner = getattr(e, "inner_exception", None) or e
        if isinstance(inner, MemoryBudgetError):
            torch._dynamo.reset()
            return inner.need_gb
        raise
    raise RuntimeError("a 1e-9 GB budget planned: the model holds no parameters to budget")
