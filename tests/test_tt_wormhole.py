"""Wormhole at optimization level 1 offline (`wancompile.tt.wormhole`): the plugin's unpacked assets lack Wormhole's
kernel sources; the worker grafts them from the ``ttnn`` wheel (downloaded once) and labels every compile made with
them a compile-only stand-in. Unit tests on fake asset folders, the download served by pip from a local folder
(``PIP_NO_INDEX``, ``PIP_FIND_LINKS``); one slow test compiles fused attention for wh-loudbox with the real plugin."""

from __future__ import annotations

import json
import os
import shutil
import string
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from test_tt import needs_tt

from wancompile.tt import wormhole
from wancompile.tt.check import ProgramCheck
from wancompile.tt.format import format_checks

WHEEL = "ttnn-0.81.1-cp312-cp312-manylinux_2_34_x86_64.whl"
TYPECAST_API = """
#include "llk_sfpu/ckernel_sfpu_cast_fp32_to_fp16a.h"
template <DataFormat in_format, DataFormat out_format>
void typecast_tile(uint32_t idst) {
    if constexpr (in_format == DataFormat::Float32 && out_format == DataFormat::Float16) {
        MATH(SFPU_UNARY_CALL(DST_SYNC_MODE, DST_ACCUM_MODE, cast_fp32_to_fp16a, (APPROX, 8), idst, VectorMode::RC));
    } else if constexpr (in_format == DataFormat::Float16 && out_format == DataFormat::Float32) {
        MATH(SFPU_UNARY_CALL(
            DST_SYNC_MODE,
            DST_ACCUM_MODE,
            cast_fp16a_to_fp32,
            (APPROX, 8 /* ITERATIONS */),
            idst,
            VectorMode::RC));
    }
}
"""
BLACKHOLE_CASTS = """
template <bool APPROXIMATION_MODE, int ITERATIONS = 8>
inline void cast_fp32_to_fp16a() {}
template <bool APPROXIMATION_MODE, int ITERATIONS>
inline void cast_fp16a_to_fp32() {
    for (int d = 0; d < ITERATIONS; d++) {}
}
"""
WORMHOLE_CASTS = """
template <bool APPROXIMATION_MODE, int ITERATIONS = 8>
inline void cast_fp32_to_fp16a() {}
"""


def fake_assets(root: Path, wormhole_sources: bool = False, typecast_hole: bool = True) -> Path:
    """A plugin's unpacked runtime assets as jax-tt-plugin 0.1.3 leaves them (Blackhole's folders, the SFPI
    compiler's bh-ilp32 multilib, the typecast API naming cast_fp16a_to_fp32, which only Blackhole's ckernels
    define), or with Wormhole's sources of its own (`wormhole_sources`)."""
    a = root / "tmp" / "libtt-tt-metal-runtime-assets-0"
    (a / "tt_metal/hw/inc/internal/tt-1xx/blackhole").mkdir(parents=True)
    for d in wormhole.MULTILIB_DIRS:
        (a / wormhole.COMPILER / d / "bh-ilp32").mkdir(parents=True)
        if wormhole_sources:
            (a / wormhole.COMPILER / d / "wh-ilp32").mkdir()
    if wormhole_sources:
        for d in wormhole.FOLDERS:
            (a / d).mkdir(parents=True)
    api = a / wormhole.TYPECAST_API
    api.parent.mkdir(parents=True)
    api.write_text(TYPECAST_API)
    for d, text in (
        ("tt_metal/hw/ckernels/blackhole/metal/llk_api/llk_sfpu", BLACKHOLE_CASTS),
        ("tt_metal/hw/ckernels/wormhole_b0/metal/llk_api/llk_sfpu", BLACKHOLE_CASTS if not typecast_hole else ""),
    ):
        (a / d).mkdir(parents=True)
        (a / d / "ckernel_sfpu_cast_fp32_to_fp16a.h").write_text("#pragma once\n" + (text or WORMHOLE_CASTS))
    (a / "tt_metal/tt-llk/tt_llk_wormhole_b0/common/inc").mkdir(parents=True)
    return a


def fake_wheel(folder: Path) -> Path:
    """A ``ttnn`` 0.81.1 wheel holding a file in each Wormhole folder (and one file the graft leaves alone)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / WHEEL
    with zipfile.ZipFile(path, "w") as z:
        for d in wormhole.FOLDERS:
            z.writestr(f"ttnn/{d}/from_wheel.h", f"// {d}\n")
        z.writestr("ttnn/tt_metal/hw/ckernels/wormhole_b0/other.h", "// not grafted\n")
        z.writestr("ttnn/_ttnn.so", b"\0" * 1000)
        z.writestr("ttnn-0.81.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: ttnn\nVersion: 0.81.1\n")
        z.writestr(
            "ttnn-0.81.1.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp312-cp312-manylinux_2_34_x86_64\n",
        )
        z.writestr("ttnn-0.81.1.dist-info/RECORD", "")
    return path


@pytest.fixture
def offline_pip(tmp_path, monkeypatch):
    """pip serves packages from ``tmp_path/index`` only (no network); returns that folder."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_CONSTRAINT", "")
    return index


def test_the_plugins_assets_lack_wormholes_folders_multilib_and_the_typecast_functions_until_grafted(
    tmp_path, offline_pip
):
    """What the graft fills in, and only that: the three Wormhole folders from the wheel (the download kept as
    its needed files only, the wheel deleted), wh-ilp32 linked to bh-ilp32 in each multilib folder, and the
    typecast functions Wormhole's ckernels lack declared in a shadow header; afterwards nothing is missing, the
    assets are a stand-in, and a second graft does nothing (no download)."""
    a = fake_assets(tmp_path)
    fake_wheel(offline_pip)
    assert wormhole.missing(a) == [
        *wormhole.FOLDERS,
        *(f"{d}/wh-ilp32" for d in wormhole.MULTILIB_DIRS),
        wormhole.SHADOW,
    ]
    assert wormhole.stand_in(a) is None
    said: list[str] = []
    done = wormhole.graft(a, tmp_path / "cache", said.append)
    assert len(done) == 7 and wormhole.missing(a) == []
    for d in wormhole.FOLDERS:
        assert (a / d / "from_wheel.h").read_text() == f"// {d}\n"
    for d in wormhole.MULTILIB_DIRS:
        assert os.readlink(a / wormhole.COMPILER / d / "wh-ilp32") == "bh-ilp32"
    kept = wormhole.sources_dir(tmp_path / "cache")
    assert sorted(p.name for p in kept.rglob("*") if p.is_file()) == ["complete.json"] + ["from_wheel.h"] * 3
    assert not list((tmp_path / "cache").rglob("*.whl"))
    assert any(x.startswith("downloading the ttnn==0.81.1 wheel") for x in said)
    assert wormhole.stand_in(a) == wormhole.StandIn(
        "Wormhole_b0", "ttnn==0.81.1", "wh-ilp32", "bh-ilp32", ("cast_fp16a_to_fp32",)
    )
    assert wormhole.stand_in(a, "Blackhole") is None
    (offline_pip / WHEEL).unlink()  # nothing to download from now on
    assert wormhole.graft(a, tmp_path / "cache", said.append) == []


def test_assets_that_have_wormholes_sources_are_left_alone_and_are_no_stand_in(tmp_path, offline_pip):
    a = fake_assets(tmp_path, wormhole_sources=True, typecast_hole=False)
    assert wormhole.missing(a) == [] and wormhole.undefined_sfpu(a) == {}
    assert wormhole.ensure("Wormhole_b0", str(tmp_path / "tmp"), tmp_path / "cache") == ""
    assert not (a / wormhole.MARKER).exists() and not (tmp_path / "cache").exists()
    assert wormhole.stand_in(a) is None


def test_a_second_assets_folder_is_grafted_from_the_kept_files_without_a_download(tmp_path, offline_pip):
    """The plugin unpacks its assets under ``$TMPDIR``; a new TMPDIR (or a cleaned one) is grafted again from the
    files kept in the cache, with no network."""
    fake_wheel(offline_pip)
    wormhole.graft(fake_assets(tmp_path / "one"), tmp_path / "cache", lambda _: None)
    (offline_pip / WHEEL).unlink()
    b = fake_assets(tmp_path / "two")
    said: list[str] = []
    assert wormhole.ensure("Wormhole_b0", str(tmp_path / "two" / "tmp"), tmp_path / "cache", said.append) == ""
    assert wormhole.missing(b) == [] and not any("download" in x for x in said)


def test_without_the_wheel_wormhole_stays_at_level_0_with_the_missing_sources_reason_and_why_the_graft_failed(
    tmp_path, offline_pip, monkeypatch
):
    """No network (pip finds no ttnn): the worker compiles a Wormhole program asking for level 1 at level 0, with
    `missing_kernel_sources`'s reason (the worker's, as before) and pip's last line; nothing half-grafted is left
    behind. Blackhole chips, or a Wormhole system once the sources are there, keep level 1."""
    from wancompile.tt import worker

    a = fake_assets(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("WANCOMPILE_TT_CACHE", str(tmp_path / "cache"))
    why, stand_in = wormhole.kernel_sources("Wormhole_b0")
    assert stand_in is None
    assert why.startswith(worker.missing_kernel_sources("Wormhole_b0")) and "tt-1xx/wormhole" in why
    assert "level 0" in why and "obtaining them failed: pip download ttnn==0.81.1 failed:" in why
    assert not (a / wormhole.FOLDERS[0]).exists() and not (a / wormhole.MARKER).exists()
    assert wormhole.kernel_sources("Blackhole") == ("", None)
    fake_wheel(offline_pip)
    why, stand_in = wormhole.kernel_sources("Wormhole_b0")
    assert why == "" and stand_in == wormhole.stand_in(a).to_json() and stand_in["multilib_from"] == "bh-ilp32"


def test_a_half_downloaded_or_foreign_wheel_is_refused(tmp_path, offline_pip):
    a = fake_assets(tmp_path)
    with zipfile.ZipFile(offline_pip / WHEEL, "w") as z:  # a ttnn without the Wormhole folders
        z.writestr("ttnn-0.81.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: ttnn\nVersion: 0.81.1\n")
        z.writestr("ttnn-0.81.1.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: cp312-cp312-manylinux_2_34_x86_64\n")
    with pytest.raises(wormhole.GraftFailed, match="has no ttnn/tt_metal/hw/inc/internal/tt-1xx/wormhole"):
        wormhole.graft(a, tmp_path / "cache", lambda _: None)
    assert not wormhole.sources_dir(tmp_path / "cache").exists() and not (a / wormhole.FOLDERS[0]).exists()


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_the_shadow_header_lets_kernels_that_never_call_the_missing_functions_build_and_no_other(tmp_path):
    """The shadow header (found before the ckernels' own on the include path) includes the real one and declares
    each function Wormhole lacks with its Blackhole signature and no code: a template that names it in a branch
    it does not take compiles; one that calls it does not, with the shadow's message; without the shadow the
    name is an error even untaken (the hole: every Wormhole kernel including the typecast API failed)."""
    a = fake_assets(tmp_path)
    functions = wormhole.undefined_sfpu(a)
    assert functions == {"cast_fp16a_to_fp32": "template <bool APPROXIMATION_MODE, int ITERATIONS>"}
    shadow = tmp_path / "shadow" / wormhole.SHADOWED
    shadow.parent.mkdir(parents=True)
    shadow.write_text(wormhole.shadow_header(functions))
    real = a / "tt_metal/hw/ckernels/wormhole_b0/metal/llk_api"
    (real / "llk_sfpu" / "ckernel_sfpu_cast_fp32_to_fp16a.h").write_text(
        "#pragma once\nnamespace ckernel { namespace sfpu {\n" + WORMHOLE_CASTS + "}}\n"
    )
    kernel = """#include "llk_sfpu/ckernel_sfpu_cast_fp32_to_fp16a.h"
template <int F> void typecast() {
    if constexpr (F == 1) { ckernel::sfpu::cast_fp32_to_fp16a<true, 8>(); }
    else if constexpr (F == 2) { ckernel::sfpu::cast_fp16a_to_fp32<true, 8>(); }
}
int main() { typecast<%d>(); }
"""

    def build(takes: int, *include: Path) -> subprocess.CompletedProcess:
        (tmp_path / "k.cpp").write_text(kernel % takes)
        flags = [f"-I{p}" for p in include]
        return subprocess.run(
            ["g++", "-std=c++17", "-fsyntax-only", *flags, str(tmp_path / "k.cpp")], capture_output=True, text=True
        )

    assert build(1, tmp_path / "shadow", real).returncode == 0
    called = build(2, tmp_path / "shadow", real)
    assert (
        called.returncode != 0 and "cast_fp16a_to_fp32: no Wormhole code in this jax-tt-plugin build" in called.stderr
    )
    bare = build(1, real)
    assert bare.returncode != 0 and "cast_fp16a_to_fp32" in bare.stderr


def test_an_op_whose_kernel_does_not_build_from_the_stand_in_sends_the_program_to_level_0_naming_it(
    tmp_path, monkeypatch
):
    """The op model's refusal ("Operation ttnn.X failed validation ... TT_THROW") after a kernel build failed: the
    reason names the op, the kernel, its core and the build log's first error, read from the log written since
    the compile started; any other error, or only older logs, is no reason."""
    from wancompile.tt.wormhole import unbuilt_kernel

    monkeypatch.setenv("TT_METAL_CACHE", str(tmp_path))
    log = tmp_path / "tt-metal-cache42/kernels/eltwise_typecast/123/trisc1/trisck.o.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        "In file included from x.cpp:1:\n/a/typecast.h:139:13: error: 'cast_fp16a_to_fp32' is not a member of "
        "'ckernel::sfpu'\n/a/macros.h:46:53: error: expected primary-expression\n"
    )
    refusal = (
        "INTERNAL: OperationValidationAndFallback: Operation ttnn.typecast failed validation (original error: "
        "MetalBackendError - Op constraint query failed with error: TT_THROW @ program.cpp:344: tt::exception"
    )
    why = unbuilt_kernel(refusal, time.time() - 60)
    assert why.startswith("ttnn.typecast's kernels do not build for Wormhole") and "level 0" in why
    assert "(eltwise_typecast on trisc1: 'cast_fp16a_to_fp32' is not a member of 'ckernel::sfpu')" in why
    assert unbuilt_kernel("INTERNAL: 'ttir.conv3d' op is not linked", time.time() - 60) == ""
    assert unbuilt_kernel(refusal, time.time() + 60) == ""


def test_tt_check_labels_a_stand_in_compile_as_data_in_its_json_and_its_text():
    r = {
        "stand_in": {
            "chips": "Wormhole_b0",
            "sources": "ttnn==0.81.1",
            "multilib": "wh-ilp32",
            "multilib_from": "bh-ilp32",
            "declared_only": ["cast_fp16a_to_fp32"],
        }
    }
    s = wormhole.StandIn.from_json(r["stand_in"])
    assert s == wormhole.StandIn("Wormhole_b0", "ttnn==0.81.1", "wh-ilp32", "bh-ilp32", ("cast_fp16a_to_fp32",))
    assert wormhole.StandIn.from_json(None) is None
    c = ProgramCheck("wan-dit", "wh-loudbox", False, "boom", options={"optimization_level": "1"}, stand_in=s)
    assert c.to_json()["stand_in"] == r["stand_in"]
    assert json.loads(json.dumps(c.to_json()))["stand_in"]["multilib_from"] == "bh-ilp32"
    text = format_checks([c])
    assert "COMPILE-ONLY STAND-IN: Wormhole_b0 kernels JIT-built from ttnn==0.81.1's sources" in text
    assert "declared without code: cast_fp16a_to_fp32" in text
    plain = ProgramCheck("wan-dit", "bh-2x4", False, "boom")
    assert plain.to_json()["stand_in"] is None and "STAND-IN" not in format_checks([plain])


def test_the_workers_progress_lines_reach_stderr_as_they_come_and_the_rest_is_captured(capfd):
    from wancompile.tt.env import _run_passing_progress

    script = (
        "import sys; print('OUT'); print('log line', file=sys.stderr); "
        f"print({wormhole.PROGRESS!r} + 'downloading', file=sys.stderr)"
    )
    res = _run_passing_progress([sys.executable, "-c", script], 60, dict(os.environ), Path.cwd())
    assert res.returncode == 0 and res.stdout == "OUT\n" and "log line" in res.stderr
    assert capfd.readouterr().err == wormhole.PROGRESS + "downloading\n"
    with pytest.raises(subprocess.TimeoutExpired):
        _run_passing_progress([sys.executable, "-c", "import time; time.sleep(30)"], 1, dict(os.environ), Path.cwd())


# q, k, v (1 x 4 heads x 64 x 32, bf16) with heads split over "model"; $S the scores, $R their rows
SDPA_2X4 = string.Template(
    """module @sdpa attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["batch"=2, "model"=4]>
  func.func @main(%q: $T {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}, {}, {}]>},
                  %k: $T {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}, {}, {}]>},
                  %v: $T {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}, {}, {}]>})
      -> (tensor<1x4x64x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}, {}, {}]>}) {
    %a = stablehlo.composite "tenstorrent.scaled_dot_product_attention" %q, %k, %v {composite_attributes = {is_causal = false}, decomposition = @sdpa} : ($T, $T, $T) -> $T
    %f = stablehlo.convert %a : ($T) -> tensor<1x4x64x32xf32>
    return %f : tensor<1x4x64x32xf32>
  }
  func.func private @sdpa(%arg0: $T, %arg1: $T, %arg2: $T) -> $T {
    %m = stablehlo.constant dense<0xFF80> : tensor<bf16>
    %z = stablehlo.constant dense<0.000000e+00> : tensor<bf16>
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0, 1] x [0, 1], contracting_dims = [3] x [3] : ($T, $T) -> $S
    %1 = stablehlo.reduce(%0 init: %m) applies stablehlo.maximum across dimensions = [3] : ($S, tensor<bf16>) -> $R
    %2 = stablehlo.broadcast_in_dim %1, dims = [0, 1, 2] : ($R) -> $S
    %3 = stablehlo.subtract %0, %2 : $S
    %4 = stablehlo.exponential %3 : $S
    %5 = stablehlo.reduce(%4 init: %z) applies stablehlo.add across dimensions = [3] : ($S, tensor<bf16>) -> $R
    %6 = stablehlo.broadcast_in_dim %5, dims = [0, 1, 2] : ($R) -> $S
    %7 = stablehlo.divide %4, %6 : $S
    %8 = stablehlo.dot_general %7, %arg2, batching_dims = [0, 1] x [0, 1], contracting_dims = [3] x [2] : ($S, $T) -> $T
    return %8 : $T
  }
}
"""
).substitute(T="tensor<1x4x64x32xbf16>", S="tensor<1x4x64x64xbf16>", R="tensor<1x4x64xbf16>")


@needs_tt
@pytest.mark.slow
def test_wh_loudbox_compiles_fused_attention_at_level_1_as_a_labelled_stand_in(tmp_path):
    """A 2x4 Shardy program, heads split over ``model``: bf16 attention handed over as the SDPA composite, its
    result cast to f32 (ttnn.typecast: the kernel the hole broke). For wh-loudbox at level 1 (the graft made on
    the first run) it compiles to one ``ttnn.scaled_dot_product_attention`` and no softmax, with a typecast, and
    the result says its kernels are a compile-only stand-in."""
    from wancompile.tt import env

    env.require()
    (tmp_path / "m.tt.mlir").write_text(SDPA_2X4)
    r, failure = env.compile_program(
        tmp_path / "m.tt.mlir", env.system_path("wh-loudbox"), tmp_path / "out", {"optimization_level": "1"}
    )
    assert not failure, failure
    assert r["options"] == {"optimization_level": "1"} and r["level_0_because"] == ""
    assert r["stand_in"]["chips"] == "Wormhole_b0" and r["stand_in"]["multilib_from"] == "bh-ilp32"
    ttnn = Path(r["ttnn"]).read_text()
    assert ttnn.count('"ttnn.scaled_dot_product_attention"') == 1 and '"ttnn.softmax"' not in ttnn
    assert '"ttnn.typecast"' in ttnn


def test_a_level_1_compile_whose_op_model_aborts_the_compiler_is_made_at_level_0_saying_so(tmp_path, monkeypatch):
    """Measured on wh-galaxy (an assembled descriptor, 8x8 worker grid): the op model's device has a 8x9 grid and
    LLVM aborts the compiler process. tt-check compiles the program at level 0 and records the abort's line."""
    from wancompile.tt import env

    calls = []

    def run_worker(args, *rest, **kw):
        level = json.loads(args[-1])["optimization_level"]
        calls.append(level)
        if level == "1":
            err = "info line\nLLVM ERROR: OpModel device worker grid does not match the registered system descriptor\n"
            return subprocess.CompletedProcess(args, -6, "", err)
        result = {"ok": True, "error": "", "options": {"optimization_level": "0"}, "level_0_because": ""}
        return subprocess.CompletedProcess(args, 0, "TT-CHECK " + json.dumps(result) + "\n", "")

    monkeypatch.setattr(env, "run_worker", run_worker)
    r, failure = env.compile_program(
        tmp_path / "m.tt.mlir", tmp_path / "d.ttsys", tmp_path / "out", {"optimization_level": "1"}
    )
    assert calls == ["1", "0"] and failure == "" and r["options"] == {"optimization_level": "0"}
    assert r["level_0_because"].startswith("level 1's op model aborted the compiler (LLVM ERROR: OpModel device")
    monkeypatch.setattr(env, "run_worker", lambda args, *a, **k: subprocess.CompletedProcess(args, -6, "", "boom\n"))
    r, failure = env.compile_program(
        tmp_path / "m.tt.mlir", tmp_path / "d.ttsys", tmp_path / "out", {"optimization_level": "1"}
    )
    assert r is None and failure.startswith("the compiler process failed (killed by SIGABRT)")
