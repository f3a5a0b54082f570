"""Seeded random tiny-DiT cases for tests/test_fuzz.py: a config, a mesh and a memory budget each,
compiled through ``backend="wan_autoshard"`` and checked against eager fp32 and against the plan.

A case draws heads, head dim, layers, FFN width, patch size, text length, I2V image tokens
(``image_dim`` / added K/V projections; diffusers then takes the last 512 text tokens as the prompt)
and a latent whose token count is often odd; the mesh is one of `MESHES`, the budget the profile's
DRAM (``ample``) or the smallest the planner accepts (``min``: the ``need_gb`` its
`MemoryBudgetError` names for a 1e-9 GB budget; 70 % of it must be refused).

`run_case` compiles one case and records everything the test judges: PCC and max-abs vs eager fp32,
the plan's predicted collectives vs every collective of every program the first call compiled (per
kind and mesh axes: counts and bytes), which programs those were (the model's program; the
parameter-only fold program, which runs once per parameter version; anything else is unpredicted)
and how many programs a second call runs.

Also a script: ``python tests/fuzz_cases.py ID...`` (in a process with as many virtual devices as
the cases' meshes) prints one ``FUZZ {json}`` line per case (``--target tt-mlir ID...``: compiled by
tt-mlir too); ``python tests/fuzz_cases.py --seed N``
runs the cases of another seed (`make_cases(N)`) whose meshes have this process's device count, to
look beyond the suite's fixed draw.
"""

from __future__ import annotations

import json
import math
import random
import sys
import zlib
from dataclasses import dataclass
from typing import Optional

MESHES = ((1, 2), (2, 1), (2, 2), (1, 4), (4, 1), (2, 4), (4, 2), (1, 8), (8, 1))
BUDGETS = ("ample", "min")
I2V_TEXT = 512  # diffusers' WanAttnProcessor splits encoder states at len - 512 (image tokens first)
IMAGE_DIM = 16


@dataclass(frozen=True)
class FuzzCase:
    id: str
    heads: int
    head_dim: int
    layers: int
    ffn: int
    latent: tuple[int, int, int]  # (T, H, W) of the latent
    mesh: tuple[int, ...]
    budget: str  # ample | min
    patch: tuple[int, int, int] = (1, 2, 2)
    text: int = 7  # prompt tokens
    image: int = 0  # I2V image-embedding tokens (0: text-to-video)
    channels: int = 4  # latent channels (TI2V-5B: 48)
    ti2v: bool = False  # a timestep per token (Wan 2.2 TI2V: the first latent frame's tokens at 0)
    dtype: str = "float32"  # the model and inputs (bfloat16: as diffusers pipelines load Wan)
    family: str = "wan-t2v"  # a `wancompile.models.FAMILIES` entry (its class and extra config/inputs)

    @property
    def devices(self) -> int:
        return math.prod(self.mesh)

    @property
    def tokens(self) -> int:
        return math.prod(n // p for n, p in zip(self.latent, self.patch))


def case(
    prefix: str,
    heads: int,
    head_dim: int,
    layers: int,
    ffn: int,
    latent: tuple[int, int, int],
    mesh: tuple[int, ...],
    budget: str,
    patch: tuple[int, int, int] = (1, 2, 2),
    text: int = 7,
    image: int = 0,
    channels: int = 4,
    ti2v: bool = False,
    dtype: str = "float32",
    family: str = "wan-t2v",
) -> FuzzCase:
    """A case whose id spells out every field (so a failing id is a reproduction)."""
    parts = [
        prefix,
        "x".join(map(str, mesh)),
        f"{heads}h{head_dim}",
        f"L{layers}",
        f"ffn{ffn}",
        "lat" + "x".join(map(str, latent)),
        "p" + "".join(map(str, patch)),
        f"txt{text}",
    ]
    if image:
        parts.append(f"img{image}")
    if channels != 4:
        parts.append(f"ch{channels}")
    if ti2v:
        parts.append("ti2v")
    if family != "wan-t2v":
        parts.append(family)
    if dtype != "float32":
        parts.append({"bfloat16": "bf16"}.get(dtype, dtype))
    parts.append(budget)
    fields = (heads, head_dim, layers, ffn, latent, mesh, budget, patch, text, image, channels, ti2v, dtype, family)
    return FuzzCase("-".join(parts), *fields)


def make_cases(seed: int = 2026, n: int = 36) -> list[FuzzCase]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        mesh = MESHES[i % len(MESHES)]
        budget = BUDGETS[(i // len(MESHES)) % len(BUDGETS)]  # each mesh at both budgets
        heads = rng.choice((1, 2, 3, 4, 5, 6, 8, 12))
        head_dim = rng.choice((4, 8, 12, 16))
        layers = rng.choice((1, 2))
        ffn = rng.choice((24, 40, 96, 200))
        patch = rng.choice(((1, 2, 2), (1, 2, 2), (1, 1, 1), (2, 2, 2)))
        frames = rng.choice((2, 4) if patch[0] == 2 else (1, 2, 3, 5))
        sizes = (2, 4, 6, 8) if patch[1] == 2 else (1, 2, 3, 5)
        latent = (frames, rng.choice(sizes), rng.choice(sizes))
        image = rng.choice((0, 0, 0, 3, 6))
        text = I2V_TEXT if image else rng.choice((1, 5, 7, 16))
        out.append(case(f"f{i:02d}", heads, head_dim, layers, ffn, latent, mesh, budget, patch, text, image))
    return out


# The reshard cases (issue 11, point 4), each once mispredicted:
FIXED = (
    # 12 heads, 72 tokens, 2x4 at the smallest budget: SP axes mix across macros (batch, model,
    # batch x model); GSPMD reorders devices between the (batch, model) and (model, batch) tilings
    case("mixed-sp", 12, 8, 2, 40, (2, 12, 12), (2, 4), "min"),
    # 1x2, 3 heads, 12 tokens
    case("1x2-3h", 3, 8, 2, 200, (3, 4, 4), (1, 2), "min"),
    # 2x2, a 3-token input
    case("3tok", 4, 8, 2, 24, (1, 2, 6), (2, 2), "min"),
)

# 12 heads, ffn 200 on 8x4 at the smallest accepted budget once emitted a 200-row weight split 32
# ways (now excluded before the solve).
ILLEGAL_SPLIT = case("illegal-split", 12, 4, 2, 200, (3, 8, 8), (8, 4), "min")


def build(c: FuzzCase, dtype: Optional[str] = None):
    """(model, inputs) of a case: random weights and inputs, seeded by the case id, in the case's dtype
    (or `dtype`: the same weights and inputs cast, e.g. the fp32 reference of a bf16 case). A family
    other than ``wan-t2v`` is its `FAMILIES` config with the case's heads, head dim, FFN and layers,
    called with its own example inputs."""
    import torch

    from wancompile.models import build_family, build_transformer

    if c.family != "wan-t2v":
        model, inputs = build_family(
            c.family, num_attention_heads=c.heads, attention_head_dim=c.head_dim, ffn_dim=c.ffn, num_layers=c.layers
        )
    else:
        extra = {"image_dim": IMAGE_DIM, "added_kv_proj_dim": c.heads * c.head_dim} if c.image else {}
        model = build_transformer(
            "tiny",
            num_attention_heads=c.heads,
            attention_head_dim=c.head_dim,
            num_layers=c.layers,
            ffn_dim=c.ffn,
            patch_size=c.patch,
            in_channels=c.channels,
            out_channels=c.channels,
            **extra,
        )
        g = torch.Generator().manual_seed(zlib.crc32(c.id.encode()))
        inputs = {
            "hidden_states": torch.randn(1, c.channels, *c.latent, generator=g),
            "timestep": torch.tensor([500]),
            "encoder_hidden_states": torch.randn(1, c.text, 32, generator=g),
        }
        if c.image:
            inputs["encoder_hidden_states_image"] = torch.randn(1, c.image, IMAGE_DIM, generator=g)
        if c.ti2v:  # the first latent frame (the given image) at timestep 0, the rest at 500
            per_frame = c.tokens // (c.latent[0] // c.patch[0])
            inputs["timestep"] = torch.tensor([[0] * per_frame + [500] * (c.tokens - per_frame)])
    dt = getattr(torch, dtype or c.dtype)
    if dt != torch.float32:
        model = model.to(dt)
        inputs = {k: v.to(dt) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    return model, inputs


def _unwrap(e: Exception) -> Exception:
    return getattr(e, "inner_exception", None) or e  # the backend's error arrives wrapped by dynamo


def run_case(c: FuzzCase, target: Optional[str] = None) -> dict:
    """Compile and run one case; returns {"id", "outcome": "pcc" | "error", ...} (module doc). With
    ``target="tt-mlir"`` the plan is pinned and its programs are also compiled by tt-mlir (compile-only,
    the smallest committed Blackhole system with the mesh's chips): ``row["tt"]`` holds one
    `wancompile.tt.check.ProgramCheck` per program."""
    import torch

    from planner.plan import MemoryBudgetError
    from wancompile import hlo, runtime
    from wancompile.backend import last_program
    from wancompile.verify import compare_collectives, numerics, run_with_backend

    model, inputs = build(c)
    mesh = "x".join(map(str, c.mesh))
    row: dict = {"id": c.id, "tokens": c.tokens}
    planned = {"target": target} if target else {}
    if target == "tt-mlir" and c.dtype != "bfloat16":
        # bf16 is how a pipeline hands tt-mlir its model, with tt-mlir's default rewrites (every pass: the rotary
        # form tt-mlir fuses, q/k/v as one matmul, patch_embed for optimization_level 1, ...); float32 cases cover
        # the graph a user gets with rewrites="none"
        planned["rewrites"] = "none"

    def refusal(memory_gb: float) -> Optional[Exception]:
        try:
            run_with_backend(model, inputs, reference=False, mesh=mesh, memory_gb=memory_gb, **planned)
        except Exception as e:
            return _unwrap(e)
        return None

    try:
        options: dict = {"mesh": mesh}
        if target is not None:
            import tempfile

            options.update(planned, dump_dir=tempfile.mkdtemp(prefix=f"wancompile-fuzz-{c.id}-"))
        if c.budget == "min":
            err = refusal(1e-9)
            if not isinstance(err, MemoryBudgetError):
                raise err or AssertionError("a 1e-9 GB budget planned")
            row["need_gb"] = options["memory_gb"] = err.need_gb
            below = refusal(err.need_gb * 0.7)
            row["below"] = type(below).__name__ if below is not None else "planned"
        dump = runtime.current_dump_dir()
        assert dump is not None, "the fuzz needs an HLO dump directory (XLA_FLAGS=--xla_dump_to)"
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="wan_autoshard", options=options, fullgraph=True)
        before = hlo.dump_state(dump)
        with torch.no_grad():
            out = compiled(**inputs, return_dict=False)
            program = last_program()
            new = hlo.new_modules(dump, before)
            runs = runtime.executions()
            compiled(**inputs, return_dict=False)
            row["programs_per_call"] = runtime.executions() - runs
            eager = model(**inputs, return_dict=False)
            if c.dtype != "float32":  # judged against eager fp32, beside eager in the case's own dtype
                model32, inputs32 = build(c, "float32")
                eager32 = model32(**inputs32, return_dict=False)
                row["eager_pcc"] = numerics(eager, eager32).pcc
                eager = eager32
        result = numerics(out, eager)
        main, fold = program.hlo_path, program.fold_hlo_path
        observed = program.collectives()
        others = [p for p in new if p not in (main, fold)]
        for p in others:  # any other program the call compiled: its collectives are unpredicted
            observed += hlo.parse_collectives(p.read_text(), program.plan.mesh)
        row.update(
            outcome="pcc",
            pcc=result.pcc,
            max_abs=result.max_abs,
            strategies={d.node: d.strategy for d in program.plan.decisions},
            matches=[
                m.__dict__ | {"axes": list(m.axes)} for m in compare_collectives(program.plan.collectives, observed)
            ],
            table=[str(m) for m in compare_collectives(program.plan.collectives, observed)],
            other_programs=[p.name for p in others],
            # None: XLA served the fold program from its cache (an earlier case compiled and counted it)
            fold_collectives=len(program.fold_collectives()) if program.fold is None or fold is not None else None,
        )
        if target == "tt-mlir":
            from pathlib import Path

            from wancompile.tt.check import check_compiled, system_for

            system = system_for(program.plan.user_mesh)
            if system is not None:
                checks = check_compiled([program], [system], Path(options["dump_dir"]))
                row["tt"] = [x.to_json() for x in checks]
    except Exception as e:  # recorded and judged by the test against the error catalogue
        inner = _unwrap(e)
        row.update(outcome="error", type=type(inner).__name__, message=str(inner)[:2000])
    return row


CASES = make_cases()
ALL = {c.id: c for c in CASES + list(FIXED) + [ILLEGAL_SPLIT]}

if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from wancompile import runtime

    runtime.configure(dump_dir=Path(tempfile.mkdtemp(prefix="wancompile-fuzz-")))
    ids = sys.argv[1:]
    target = None
    if ids[:1] == ["--target"]:
        target, ids = ids[1], ids[2:]
    if ids[:1] == ["--seed"]:
        import torch_xla.runtime as xr

        drawn = make_cases(int(ids[1]))
        ALL.update({c.id: c for c in drawn})
        ids = [c.id for c in drawn if c.devices == xr.global_runtime_device_count()]
    for case_id in ids:
        print("FUZZ " + json.dumps(run_case(ALL[case_id], target)), flush=True)
