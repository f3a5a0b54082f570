"""``wancompile tt-check``: compile a tiny model's programs through tt-mlir (or, with ``--blocks N``, a
full-size model's first N blocks at full width, exported without running) and compare TTNN's collectives
and DRAM per chip with the plan's."""

from __future__ import annotations

import argparse
from pathlib import Path

from wancompile.cli.args import UsageError, check_video


def tt_check_command(args: argparse.Namespace) -> int:
    import json

    from planner.mesh import parse_mesh
    from wancompile.models import MODELS
    from wancompile.tt.env import TtUnavailable
    from wancompile.tt.format import format_checks
    from wancompile.tt.fullsize import VAE_LATENTS
    from wancompile.tt.tiny import check_model

    try:
        mesh = parse_mesh(args.mesh)
    except ValueError as e:
        raise UsageError(f"--mesh: {e}") from None
    if args.blocks is not None or args.model in MODELS and args.model != "tiny" or args.model in VAE_LATENTS:
        return _full_size(args, mesh)
    from wancompile.models import FAMILIES

    if args.model in FAMILIES and (args.batch != 1 or args.frames is not None):
        raise UsageError(
            f"--model {args.model}: a Wan-family DiT is checked with its own example inputs (no --batch, --frames)"
        )
    if args.tightest and (args.memory_gb is not None or args.plan or args.component == "vae"):
        raise UsageError(
            "--tightest finds the budget of an auto plan of a DiT: drop --memory-gb, --plan, --component vae"
        )
    out = _out_dir(args)
    try:
        report = check_model(
            args.model,
            mesh,
            args.system,
            out,
            component=args.component,
            plan=args.plan,
            memory_gb=args.memory_gb,
            rewrites=args.rewrites,
            frames=args.frames or 9,
            batch=args.batch,
            cfg_parallel=args.cfg_parallel,
            hardware=args.hardware,
            t_chunk=args.t_chunk,
            dtype=args.dtype or "float32",
            tightest=args.tightest,
            unannotated=args.unannotated,
        )
    except TtUnavailable as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # the backend's own error, out of dynamo's BackendCompilerFailed
        inner = getattr(e, "inner_exception", None)
        if inner is not None:
            raise inner from None
        raise
    _record_memory(out / "plan.json", report.checks)
    if args.json:
        print(json.dumps(report.to_json() | {"out": str(out)}))
    else:
        print(report.plan_summary)
        print(f"  pinned for tt-mlir: {report.pins} pins, {report.constraints} constraints in all")
        print(f"  on CPU (GSPMD) vs eager fp32: PCC {report.pcc:.7f}, max-abs {report.max_abs:.2e}")
        if args.dtype not in (None, "float32"):
            print(f"  eager {args.dtype} vs eager fp32: PCC {report.eager_pcc:.7f}, max-abs {report.eager_max_abs:.2e}")
        print(format_checks(report.checks))
        print(f"programs and IRs: {out}")
    return 0 if report.ok else 1


def _out_dir(args: argparse.Namespace) -> Path:
    """``--out``, else a new folder under `default_out` (one per run, so that two runs never share
    one), which the report prints: no run leaves its programs in /tmp."""
    if args.out:
        return Path(args.out)
    import tempfile

    default_out().mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="run-", dir=default_out()))


def default_out() -> Path:
    """Where tt-check's runs without ``--out`` go: ``tt-check`` in the tt cache (`wancompile.tt.env`)."""
    from wancompile.tt.env import cache_dir

    return cache_dir() / "tt-check"


def _full_size(args: argparse.Namespace, mesh) -> int:
    """A full-size model, exported without running (`wancompile.tt.fullsize`): a transformer's first
    ``--blocks N`` blocks at full width, or a VAE's whole decode (``--component vae --model wan2.1``)."""
    import json

    from wancompile.models import MODELS
    from wancompile.options import OptionsError, parse_rewrites
    from wancompile.tt.env import TtUnavailable
    from wancompile.tt.fullsize import VAE_LATENTS, check_full_size, check_full_size_vae

    if args.tightest:
        raise UsageError("--tightest is for a tiny DiT; a full-size model is planned within --memory-gb")
    vae = args.component == "vae"
    if vae != (args.model in VAE_LATENTS):
        raise UsageError(
            f"--model {args.model} is a VAE: pass --component vae"
            if not vae
            else f"--component vae takes a VAE: {', '.join(VAE_LATENTS)} (full size) or tiny-wan2.1 | tiny-wan2.2"
        )
    if vae and args.blocks is not None:
        raise UsageError("--blocks counts a transformer's blocks; a VAE decode is compiled whole")
    if not vae and args.blocks is None:
        raise UsageError(f"--model {args.model} is full size: say how many of its blocks to compile, e.g. --blocks 2")
    if not vae and (args.model not in MODELS or args.model == "tiny"):
        raise UsageError(f"--blocks needs a full-size --model ({', '.join(m for m in MODELS if m != 'tiny')})")
    if vae and args.unannotated:
        raise UsageError("--unannotated compares a DiT's pinned program; a full-size VAE takes no --unannotated")
    if args.plan is not None or args.batch != 1 or args.t_chunk is not None:
        raise UsageError("a full-size check plans the model itself (batch 1, full-T); drop --plan, --batch, --t-chunk")
    try:
        rewrites = parse_rewrites(args.rewrites)
    except OptionsError as e:
        raise UsageError(f"--rewrites: {e}") from None
    spec = MODELS[VAE_LATENTS[args.model] if vae else args.model]
    check_video(spec, args.resolution, args.frames or 81)
    layers = spec.transformer["num_layers"]
    if not vae and args.blocks > layers:
        raise UsageError(f"--blocks: {args.model} has {layers} blocks; got {args.blocks}")
    out = _out_dir(args)
    common = dict(
        resolution=args.resolution, frames=args.frames or 81, hardware=args.hardware, memory_gb=args.memory_gb
    )
    what = (args.model, mesh, args.system, out)
    try:
        if vae:
            report = check_full_size_vae(*what, rewrites=rewrites, **common)
        else:
            report = check_full_size(
                *what,
                blocks=args.blocks,
                dtype=args.dtype or "bfloat16",
                weight_sets=args.experts,
                rewrites=rewrites,
                unannotated=args.unannotated,
                **common,
            )
    except TtUnavailable as e:
        raise UsageError(str(e)) from None
    _record_memory(out / "plan.json", report.checks)
    if args.json:
        print(json.dumps(report.to_json() | {"out": str(out)}))
    else:
        print(report.format())
        print(f"programs and IRs: {out}")
    return 0 if report.ok else 1


def _record_memory(path: Path, checks) -> None:
    """The main program's TTNN memory per system, beside the planner's estimate, and its TTNN ops per part of
    the model, in the dump's plan.json."""
    from planner.hardware import get_profile
    from planner.plan import CompiledKernels, CompiledMemory, load_plan, save_plan
    from wancompile.tt.env import SYSTEM_PROFILES

    if not path.exists():
        return
    rows = tuple(
        CompiledMemory(
            c.system,
            c.memory.peak_bytes,
            c.memory.peak_logical_bytes,
            c.memory.arguments_bytes,
            c.memory.constants_bytes,
            c.planned_bytes,
            int(get_profile(SYSTEM_PROFILES[c.system]).dram_bytes.value) if c.system in SYSTEM_PROFILES else 0,
        )
        for c in checks
        if c.memory is not None and c.planned_bytes is not None
    )
    main = {c.program for c in checks if c.planned_bytes is not None}
    kernels = tuple(
        CompiledKernels(c.system, part, dict(ops)) for c in checks if c.program in main for part, ops in c.parts
    )
    if rows or kernels:
        save_plan(load_plan(path).with_(compiled_memory=rows, compiled_kernels=kernels), path)
