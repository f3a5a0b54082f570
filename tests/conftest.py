"""Shared fixtures: one SPMD XLA runtime with 8 virtual CPU devices per test process, tiny models, and
the graphs dynamo hands a backend (for the rewrite tests: each test gets a fresh copy to rewrite in place).

The PJRT client reads its device count and XLA_FLAGS once, so they are set here, before anything
imports torch_xla. Tests that need another device count run a subprocess
(`wancompile.runtime.subprocess_env`).
"""

import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

if __name__ != "conftest":  # a second copy (``tests.conftest``) would point XLA_FLAGS at another dump dir
    raise ImportError("import test helpers with `from conftest import ...`, not as tests.conftest")
ROOT = Path(__file__).resolve().parents[1]
HLO_DUMP = Path(tempfile.mkdtemp(prefix="wancompile-test-hlo-"))
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ["CPU_NUM_DEVICES"] = "8"
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_dump_to=")]
    + [f"--xla_dump_to={HLO_DUMP}"]
)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# The heaviest tests outside `slow` (measured with --durations on 2 shared cores: 10-50 s each), marked
# `slow` here so that `python -m pytest -m "not slow"` is a fast loop; CI (`.ci/run`) runs everything.
# Node-id prefixes; a renamed test simply runs in the fast loop again.
HEAVY = (
    "tests/test_family_vace.py::test_vace_compiles_to_its_prediction",  # about 40 s per case (a compile)
    "tests/test_backend.py::test_dynamic_shapes_record_guards_and_replan_when_a_resolution_breaks_them",
    "tests/test_backend.py::test_without_a_plan_option_the_planner_plans",
    "tests/test_fold.py::test_qkv_packing_is_folded_once_with_its_tp_sharding_and_the_same_collectives",
    "tests/test_vae_compile.py::test_chunked_decode_is_one_graph_per_chunk_shape",
    "tests/test_vae_compile.py::test_full_t_decode_is_one_graph",
    "tests/test_rewrites_sharded.py::test_auto_plan_after_rope_patch_embed_and_sp_pad_compiles_to_its_prediction",
    "tests/test_rewrites_sharded.py::test_sp_padding_runs_45_tokens_on_sp2_without_per_block_kv_slices",
    "tests/test_rewrites_sharded.py::test_saved_plan_remembers_its_rewrites",
    "tests/test_rewrites_sharded.py::test_qkv_fusion_under_tp_adds_no_collective",
    "tests/test_capture.py::test_every_graph_of_the_streaming_vae_decode_is_annotated",
    "tests/test_vae_full_t.py::test_decode_equals_streaming_decode[tiny-wan2.1-9",
    "tests/test_vae_full_t.py::test_decode_equals_streaming_decode[tiny-wan2.2-9",
    "tests/test_pipeline.py::test_vae_auto_decodes_chunked_t_when_the_budget_left_by_the_experts_is_short",
    "tests/test_pipeline.py::test_two_expert_pipeline_matches_eager_with_one_graph_one_fold_per_expert",
    "tests/test_pipeline.py::test_cfg_parallel_runs_the_guidance_pair_as_one_batch2_forward_with_the_same_numbers",
    "tests/test_pipeline.py::test_replayed_dit_follows_every_call_s_timestep_and_latents",
    "tests/test_replay.py::test_a_new_input_shape_is_traced_once_more",
    "tests/test_entry_order.py::test_cpu_num_devices_that_disagrees_with_the_mesh_is_an_error_not_rewritten",  # subprocesses
    "tests/test_entry_order.py::test_xla_before_wancompile_is_refused_with_the_fix_not_a_segfault",
    "tests/test_entry_order.py::test_use_spmd_forced_after_the_runtime_started_is_refused",
    "tests/test_vae_full_t.py::test_float64_decode_equals_streaming_to_rounding",
    "tests/test_vae_full_t.py::test_slicing_and_tuple_output_follow_diffusers",
    "tests/test_vae_budget.py::test_estimate_bounds_the_measured_peak_within_2_5x",
)


def pytest_addoption(parser):
    parser.addoption(
        "--long-tail",
        action="store_true",
        help="also run the tests marked long_tail (the GSPMD fuzz's whole draw: ~5 min on 2 cores; not in CI)",
    )


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="the fuzz's long tail runs with --long-tail (CI runs the fixed subset)")
    for item in items:
        if item.nodeid.startswith(HEAVY):
            item.add_marker(pytest.mark.slow)
        if "long_tail" in item.keywords and not config.getoption("--long-tail"):
            item.add_marker(skip)


_LOGGER = __import__("logging").getLogger("wancompile")
_LOGGER_STATE = (_LOGGER.handlers[:], _LOGGER.level, _LOGGER.propagate)  # as the session found it


@pytest.fixture(autouse=True)
def _wancompile_logger():
    """The ``wancompile`` logger as the session found it, after each test: the CLI run in-process
    (`wancompile.progress.setup_logging`, also from module-scoped fixtures) points it at that test's
    stderr and stops propagation, which later tests' ``caplog`` would not see."""
    yield
    _LOGGER.handlers[:] = _LOGGER_STATE[0]
    _LOGGER.level, _LOGGER.propagate = _LOGGER_STATE[1], _LOGGER_STATE[2]


@pytest.fixture(scope="session")
def spmd():
    """The process's SPMD runtime (8 virtual CPU devices)."""
    from wancompile import runtime

    runtime.use_spmd()
    assert runtime.device_count() == 8
    return runtime


@pytest.fixture(scope="session")
def tiny_model():
    from wancompile.models import build_transformer

    return build_transformer("tiny")


@pytest.fixture(scope="session")
def tiny_inputs():
    from wancompile.models import transformer_inputs

    return transformer_inputs("tiny", "tiny", 9)


@pytest.fixture(scope="session")
def tiny_capture(tiny_model, tiny_inputs):
    """(Graph, GraphModule) of the tiny DiT as dynamo hands it to a backend."""
    from wancompile.capture import capture_module

    return capture_module(tiny_model, **tiny_inputs, return_dict=False, model="tiny")


# `wancompile plan` on the tiny DiT at its own resolution, 9 frames, on 2x4 (the CLI tests add their options)
TINY_PLAN = ["plan", "--model", "tiny", "--resolution", "tiny", "--frames", "9", "--mesh", "2x4"]


# what ``rewrites="all"`` does to the tiny DiT at 9 frames (45 tokens, padded for SP 4): passes and their counts
TINY_ALL_REWRITES = {"qkv": 4, "rmsnorm": 0, "conv1x1": 0, "patch_embed": 1, "rope": 4, "sp_pad": 2}


def run_script(args, num_devices, timeout=900, stderr=False, **env_extra):
    """Run a Python script in a subprocess with its own virtual device count (and extra environment
    variables); return stdout, or (stdout, stderr) with ``stderr=True``."""
    import subprocess

    from wancompile.runtime import subprocess_env

    env = subprocess_env(num_devices, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return (proc.stdout, proc.stderr) if stderr else proc.stdout


def save_vae_plan(path, *, model="tiny-wan2.1", mesh="2x4", target="gspmd", only=None, preset="spatial"):
    """A plan for the tiny VAE's full-T decode (captured as the backend captures it), saved to `path`."""
    import torch

    import wancompile.vae as wvae
    from planner.mesh import parse_mesh
    from planner.plan import save_plan
    from planner.vae_plan import plan_vae
    from wancompile.capture import annotate, capture_fx
    from wancompile.vae.configs import build_vae
    from wancompile.vae.legalize import fold_conv_padding

    vae = wvae.enable_full_t(build_vae(model))
    z = torch.randn(1, vae.config.z_dim, 3, 8, 8)
    g = annotate(fold_conv_padding(capture_fx(vae.decode, z))[0], model="wan-vae")
    plan = plan_vae(g, parse_mesh(mesh), "wh-loudbox", preset=preset, only=only, target=target)
    save_plan(plan, path)
    return plan


@__import__("contextlib").contextmanager
def raises_from_backend(exc_type, match):
    """Like ``pytest.raises(exc_type, match=...)`` for an error raised inside the backend: dynamo
    wraps it in ``BackendCompilerFailed``; the backend's own error is its ``inner_exception``."""
    with pytest.raises(Exception) as info:
        yield info
    err = getattr(info.value, "inner_exception", None) or info.value
    assert isinstance(err, exc_type), f"expected {exc_type.__name__}, got {type(err).__name__}: {err}"
    assert re.search(match, str(err)), f"{match!r} not in {err}"


def match_rows(matches) -> list[dict]:
    """`wancompile.verify.CollectiveMatch`es as the fidelity scripts write them to JSON (one dict each, what
    `assert_matches_prediction` reads back)."""
    return [
        {
            "kind": m.kind,
            "axes": list(m.axes),
            "predicted_count": m.predicted_count,
            "observed_count": m.observed_count,
            "predicted_bytes": m.predicted_bytes,
            "observed_bytes": m.observed_bytes,
        }
        for m in matches
    ]


def fidelity_row(case: str, result, program, **more) -> dict:
    """One compiled case as the fidelity scripts print it (``FIDELITY {json}``, read back by `fidelity_rows`):
    the case; `result`, the numerics against the reference (`wancompile.verify.numerics`); the plan's strategy
    per decision; its predicted collectives against the compiled ones per (kind, axes) (``matches``, and as
    text in ``table``); the HLO they were read from; then what the script adds (`more`)."""
    from wancompile.verify import compare_collectives

    matches = compare_collectives(program.plan.collectives, program.collectives())
    return {
        "case": case,
        "pcc": result.pcc,
        "max_abs": result.max_abs,
        "strategies": {d.node: d.strategy for d in program.plan.decisions},
        "matches": match_rows(matches),
        "table": [str(m) for m in matches],
        "hlo": str(program.hlo_path),
        **more,
    }


def assert_matches_prediction(matches, where: str) -> None:
    """Every (kind, axes) row of a fidelity comparison (`wancompile.verify.CollectiveMatch` as the
    scripts write it to JSON): the predicted count is the compiled one, bytes within 5 %."""
    from wancompile.verify import CollectiveMatch

    for m in matches:
        row = CollectiveMatch(
            m["kind"],
            tuple(m["axes"]),
            m["predicted_count"],
            m["observed_count"],
            m["predicted_bytes"],
            m["observed_bytes"],
        )
        assert row.count_ok, f"{where}: predicted != compiled ({row.kind} {row.axes})"
        assert row.bytes_ok(), f"{where}: bytes off by more than 5% ({row.kind} {row.axes})"


def fidelity_rows(args, num_devices, expected, timeout=900, remat_ok=False, **env_extra):
    """Run a fidelity script (one JSON object per ``FIDELITY {...}`` line); return the rows. Unless
    `remat_ok`, GSPMD must not have fallen back to "Involuntary full rematerialization" (a layout it could
    not reach by a collective, replicated and sliced instead)."""
    import json

    out, err = run_script(args, num_devices, timeout=timeout, stderr=True, **env_extra)
    rows = [json.loads(line[len("FIDELITY ") :]) for line in out.splitlines() if line.startswith("FIDELITY ")]
    assert len(rows) == expected, out[-3000:]
    assert remat_ok or "Involuntary full rematerialization" not in err, err[-3000:]
    return rows


# --- graphs as dynamo hands them to a backend (rewrite tests) ---------------------------------------

import torch  # noqa: E402  (after the XLA environment above)
import torch.fx as fx  # noqa: E402


def capture(fn, *args, **kwargs) -> list[tuple[fx.GraphModule, list]]:
    """(GraphModule, example inputs) of every graph dynamo hands a backend for ``fn(*args, **kwargs)``."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=record)(*args, **kwargs)
    return graphs


def meta_graph(model: str, resolution: str, frames: int, *, layers=None, dtype=torch.float32, batch: int = 1):
    """The planner's graph of the DiT `model` (`wancompile.models`; its first `layers` blocks, all when None)
    at `resolution` and `frames`, batch `batch`, in `dtype`, captured on the meta device (no weights, no
    compute: full-size models plan here)."""
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    m = build_transformer(model, device="meta", num_layers=layers).to(dtype)
    inp = transformer_inputs(model, resolution, frames, device="meta", dtype=dtype, batch=batch)
    return capture_module(m, **inp, return_dict=False, model=model)[0]


def fresh(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose graph can be rewritten without touching ``gm`` (node meta is shared)."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


def normalized_code(gm: fx.GraphModule) -> str:
    """``gm``'s Python code for a golden: no comments, no FX's ``x = None`` frees, no placeholder
    aliases, no trailing spaces."""
    lines = []
    for line in gm.code.splitlines():
        line = re.sub(r";\s+[\w\s=]+= None\s*$", "", line.split("#")[0]).rstrip()
        if line.strip() and not re.fullmatch(r"\s+(\w+) = L_\w+", line):
            lines.append(line)
    return "\n".join(lines)


def tiny_dit(num_layers: int = 2):
    """The ``tiny`` DiT (wancompile.models), random weights seeded 0."""
    from wancompile.models import build_transformer

    return build_transformer("tiny", num_layers=num_layers)


def dit_graph(frames: int, height: int, width: int) -> tuple[fx.GraphModule, list]:
    model = tiny_dit()
    torch.manual_seed(1)
    x, t, prompt = torch.randn(1, 4, frames, height, width), torch.tensor([500]), torch.randn(1, 7, 32)
    (graph,) = capture(lambda *a: model(*a, return_dict=False), x, t, prompt)
    return graph


@pytest.fixture(scope="session")
def _dit48():
    return dit_graph(3, 8, 8)  # 3 × 4 × 4 = 48 tokens


@pytest.fixture(scope="session")
def _dit45():
    return dit_graph(5, 6, 6)  # 5 × 3 × 3 = 45 tokens


@pytest.fixture(scope="session")
def _vae():
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2],
        num_res_blocks=1,
        temperal_downsample=[True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()
    torch.manual_seed(1)
    return capture(lambda z: vae.decode(z, return_dict=False), torch.randn(1, 4, 2, 4, 4))


@pytest.fixture
def dit(_dit48):
    """The tiny 2-block DiT's graph (48 tokens) and its inputs (parameters included)."""
    return fresh(_dit48[0]), _dit48[1]


@pytest.fixture
def dit45(_dit45):
    """The same DiT on a 5×6×6 latent: 45 tokens, which 2 and 4 do not divide."""
    return fresh(_dit45[0]), _dit45[1]


@pytest.fixture
def vae_graphs(_vae):
    """Every graph of a tiny ``AutoencoderKLWan.decode`` on 2 latent frames, with its inputs."""
    return [(fresh(gm), inputs) for gm, inputs in _vae]
