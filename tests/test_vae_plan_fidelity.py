"""Fidelity of the VAE planner: the compiled sharded decode (spatial, channel-Megatron) IS what the plan says.

The tiny Wan 2.1 VAE, full-T (`enable_full_t`), compiled with
``torch.compile(vae.decode, backend="wan_autoshard", options={"mesh": ..., "memory_gb": ...})`` on
2x2 and 2x4 meshes of virtual CPU devices (one subprocess per mesh and suite: the device count is fixed
per process). The plan is the planner's with every macro restricted to spatial strategies
(``plan_vae(..., preset="spatial")``: the solver still picks which mesh axes split H and W, and
gather vs frames for the attention), saved and passed as the backend's ``plan`` option, as
tests/test_fidelity.py does for Ulysses. The compiled program is checked against it:

- per (kind, mesh axes), exactly the predicted number of collectives, bytes within 5%;
- spatial: halo collective-permutes are there, and no all-reduce anywhere;
- channel-megatron (the seed's hand plan, ``preset="channel-megatron"``): every residual block
  channel-split over the whole mesh, the rest replicated; per block exactly the seed's bill, one
  all-reduce of norm2's channel statistics and one of conv2's output, attributed by the ``op_type``
  metadata ``XLA_HLO_DEBUG=1`` puts on each HLO instruction (XLA keeps no module path);
- PCC >= 0.99999 against the same graph on one XLA device (``program.replicated()``);
- no "Involuntary full rematerialization" in XLA's log.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import assert_matches_prediction, fidelity_row

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "tiny-wan2.1"
LATENT = (1, 16, 3, 8, 8)  # (B, C, T, H, W): 8 x 8 splits evenly on 2 and 4 devices at every stage
MESHES = {"2x2": 4, "2x4": 8}  # mesh -> devices
# suite -> case -> (plan_vae preset, restriction). spatial: the solver's spatial plan, and a 2-D
# split (H over batch, W over model); channel: the seed's channel-Megatron hand plan
SUITES = {
    "spatial": {"spatial": ("spatial", {}), "2d": ("spatial", {"*": r"\(H:batch,W:model\)$"})},
    "channel": {"channel-megatron": ("channel-megatron", {})},
    "wan2.2": {"2d": ("spatial", {"*": r"\(H:batch,W:model\)$"})},
}
# suite -> (config, latent) where not CONFIG, LATENT: Wan 2.2's VAE (z_dim 48, DupUp3D shortcuts)
MODELS = {"wan2.2": ("tiny-wan2.2", (1, 48, 3, 8, 8))}


def _run(mesh: str, suite: str = "spatial") -> list[dict]:
    from conftest import fidelity_rows

    # XLA_HLO_DEBUG: op_type metadata on each HLO instruction, i.e. which aten op a collective came from
    return fidelity_rows([__file__, mesh, suite], MESHES[mesh], len(SUITES[suite]), timeout=600, XLA_HLO_DEBUG="1")


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
def test_spatial_vae_plan_compiles_to_its_predicted_collectives(mesh):
    rows = _run(mesh)
    for row in rows:
        _check(row)
    assert {s for s in rows[1]["strategies"].values()} <= {"spatial(H:batch,W:model)", "gather(H:batch,W:model)"}
    axes = {tuple(m["axes"]) for m in rows[1]["matches"] if m["kind"] == "collective-permute"}
    assert axes == {("batch",), ("model",)}, rows[1]["table"]  # halos on both split dims


@pytest.mark.slow
def test_wan22_spatial_decode_compiles_to_its_predicted_collectives():
    """Wan 2.2's VAE: its ``avg_shortcut`` (DupUp3D) duplicates channels with ``repeat_interleave``,
    whose rule keeps the H/W split (no rule: the planner predicted 4 all-gathers where GSPMD emits 1)."""
    rows = _run("2x4", "wan2.2")
    (row,) = rows
    _check(row)
    assert row["strategies"]["decoder.up_blocks.0.avg_shortcut"] == "spatial(H:batch,W:model)", row["strategies"]


def _check(row: dict) -> None:
    table = "\n".join(row["table"])
    print(
        f"{row['mesh']} {row['case']}: PCC {row['pcc']:.9f}, max-abs {row['max_abs']:.3g}\n{table}\n{json.dumps(row['strategies'], indent=1)}"
    )
    assert row["pcc"] >= 0.99999, (row["pcc"], row["max_abs"])
    # the plan is spatial: every residual block is split on H/W
    assert all(s.startswith("spatial") for k, s in row["strategies"].items() if ".resnets." in k), row["strategies"]
    assert_matches_prediction(row["matches"], table)
    kinds = {m["kind"] for m in row["matches"] if m["observed_count"]}
    assert "collective-permute" in kinds, table
    resblock = next(s for k, s in row["strategies"].items() if ".resnets." in k)
    split_dims = sum(1 for part in re.findall(r"[HW]:([^,)]*)", resblock) if part != "-")
    assert row["permutes"] >= 2 * split_dims * row["spatial_resblock_convs"], (
        table
    )  # 2 sides per split dim per 3x3 conv
    assert not [c for c in row["collective_ops"] if c["kind"] == "all-reduce"], row["collective_ops"]  # none at all


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
def test_channel_megatron_vae_plan_compiles_to_its_predicted_collectives(mesh):
    """The seed's hand plan (seed 001, docs/seeds.md): per residual block exactly its bill, one all-reduce of
    conv2's partial-sum output (B, C, T, H, W) and one of norm2's channel statistics (B, T, H, W)."""
    rows = _run(mesh, "channel")
    (row,) = rows
    table = "\n".join(row["table"])
    print(f"{row['mesh']} {row['case']}: PCC {row['pcc']:.12f}, max-abs {row['max_abs']:.3g}\n{table}")
    assert row["pcc"] >= 0.99999, (row["pcc"], row["max_abs"])
    blocks = [k for k, s in row["strategies"].items() if ".resnets." in k]
    assert blocks and all(re.fullmatch(r"channel\(batch\+model\)", row["strategies"][k]) for k in blocks), row[
        "strategies"
    ]
    assert all(s == "replicated" for k, s in row["strategies"].items() if k not in blocks), row["strategies"]
    assert_matches_prediction(row["matches"], table)
    assert {(m["kind"], tuple(m["axes"])) for m in row["matches"] if m["observed_count"]} == {
        ("all-reduce", ("batch", "model"))
    }, table
    # by the aten op each all-reduce came from (XLA_HLO_DEBUG metadata), in program order: per block
    # the norm2 statistics sum (channels collapsed) then conv2's output (all channels)
    ars = [c for c in row["collective_ops"] if c["kind"] == "all-reduce"]
    n_blocks = row["channel_resblocks"]
    assert n_blocks == 10 and len(ars) == 2 * n_blocks, [c["line"] for c in ars]
    for norm, conv, conv2 in zip(ars[0::2], ars[1::2], row["conv2_shapes"]):
        assert norm["op_type"] == "aten__sum" and conv["op_type"] == "aten__convolution_overrideable", (norm, conv)
        assert conv["shape"] == conv2, (conv["line"], conv2)
        assert norm["shape"] == conv2[:1] + conv2[2:], (norm["line"], conv2)  # C collapsed


# --- the subprocess -------------------------------------------------------------------------------


def _count(decision_node: str) -> int:
    m = re.search(r"\(x(\d+)\)$", decision_node)
    return int(m.group(1)) if m else 1


def _main(mesh: str, suite: str) -> None:
    import tempfile

    from wancompile import runtime

    devices = MESHES[mesh]
    dump = Path(tempfile.mkdtemp(prefix=f"wancompile-vae-fidelity-{mesh}-"))
    runtime.configure(num_devices=devices, dump_dir=dump / "hlo")

    import torch

    import wancompile.vae as wvae
    from planner.mesh import parse_mesh
    from planner.plan import save_plan
    from planner.vae_plan import plan_vae
    from wancompile.backend import default_hardware
    from wancompile.capture import annotate, capture_fx
    from wancompile.vae.configs import build_vae
    from wancompile.vae.legalize import fold_conv_padding

    config, latent = MODELS.get(suite, (CONFIG, LATENT))
    vae = wvae.enable_full_t(build_vae(config))
    z = torch.randn(*latent, generator=torch.Generator().manual_seed(0))
    spec = parse_mesh(mesh)
    graph = annotate(fold_conv_padding(capture_fx(vae.decode, z))[0], model="wan-vae")
    for case, (preset, only) in SUITES[suite].items():
        plan = plan_vae(graph, spec, default_hardware(spec), preset=preset, only=only)
        _compile_and_check(vae, z, mesh, case, save_plan(plan, dump / f"{case}.plan.json"))


def _compile_and_check(vae, z, mesh: str, case: str, plan_path: Path) -> None:
    import torch

    from wancompile.backend import last_program
    from wancompile.hlo import KINDS
    from wancompile.verify import numerics

    torch._dynamo.reset()
    decode = torch.compile(
        vae.decode, backend="wan_autoshard", options={"mesh": mesh, "plan": str(plan_path)}, fullgraph=True
    )
    with torch.no_grad():
        out = decode(z).sample
        program = last_program()
        state = {**dict(vae.named_parameters()), **dict(vae.named_buffers())}
        args = [state[n.param] if n.param else z for n in program.graph if n.op == "placeholder"]
        ref = program.replicated()(*args)[0]
    result = numerics(out, ref)
    hlo_text = program.hlo_path.read_text()
    collective_ops = []  # every non-permute collective with its op_name (where in the model it sits)
    permutes = 0
    for line in hlo_text.splitlines():
        kind = next((k for k in KINDS if re.search(rf"\s{k}(-start)?\(", line)), None)
        if kind == "collective-permute":
            permutes += 1
        if kind is not None and kind != "collective-permute":
            shape = re.search(r"=\s*\w+\[([\d,]*)\]", line)
            op_type = re.search(r'op_type="([^"]*)"', line)
            collective_ops.append(
                {
                    "kind": kind,
                    "op_type": op_type.group(1) if op_type else "",
                    "line": line.strip()[:160],
                    "shape": [int(x) for x in shape.group(1).split(",") if x] if shape else None,
                }
            )
    conv2_shapes = [
        list(n.out.shape)
        for n in program.graph
        if n.op == "conv3d" and ".resnets." in n.module and n.module.endswith("conv2")
    ]
    spatial_convs = sum(
        1
        for n in program.graph
        if n.op == "conv3d" and ".resnets." in n.module and n.module.endswith(("conv1", "conv2"))
    )
    row = fidelity_row(
        case,
        result,
        program,
        mesh=mesh,
        permutes=permutes,
        spatial_resblock_convs=spatial_convs,
        collective_ops=collective_ops,
        conv2_shapes=conv2_shapes,
        channel_resblocks=sum(
            1 for d in program.plan.decisions if d.strategy.startswith("channel") for _ in range(_count(d.node))
        ),
        predicted=program.plan.predicted.to_json(),
    )
    print("FIDELITY " + json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "spatial")
