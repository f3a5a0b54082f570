"""Wormhole kernel sources for jax-tt-plugin 0.1.3's optimization level 1, offline: a compile-only stand-in.

This module owns what a compile at optimization level >= 1 needs of the chips' kernel sources: whether the
plugin's assets have them (`missing_kernel_sources`), the Wormhole graft (the first-run step that lets the
plugin's level-1 op model JIT-build Wormhole kernels on a machine without a Wormhole toolchain), the data that
says a compile used it (`StandIn`), and the worker's decision to compile at level 0 instead (`kernel_sources`
before the compile, `unbuilt_kernel` after an op's kernel failed to build).

At optimization level >= 1 tt-mlir's optimizer asks TTNN's op model about each op, and the op model JIT-builds
the chips' firmware and kernels with the RISC-V toolchain the plugin unpacks into ``$TMPDIR``
(``libtt-tt-metal-runtime-assets-<hash>``). jax-tt-plugin 0.1.3's assets lack three Wormhole folders (device
headers ``tt_metal/hw/inc/internal/tt-1xx/wormhole``, runtime objects ``runtime/hw/lib/wormhole``, linker
scripts ``runtime/hw/toolchain/wormhole``), and its SFPI compiler lists a ``wh-ilp32`` multilib that is not
there. `graft` fills them in, as ``tt-offline/scripts/wormhole_graft.sh`` does:

- the three folders, copied from the package index's ``ttnn`` 0.81.1 wheel (`TTNN`). The wheel is cp310/cp312
  only, so it is downloaded (``pip download --no-deps --python-version 3.12 --only-binary=:all:``, ~103 MB),
  never installed; the ~0.8 MB of files needed are extracted into the tt cache folder (`sources_dir`) and the
  wheel deleted, so the download happens once per cache folder;
- the ``wh-ilp32`` multilib (libc, libstdc++, libgcc) pointed at ``bh-ilp32``, Blackhole's;
- a header declaring, without code, the SFPU functions the plugin's typecast API names but its Wormhole ckernels
  do not define (`SHADOW`, `undefined_sfpu`): without it every Wormhole compute kernel that includes the API
  (typecast, layernorm, reduce, ...) fails to build; with it those that never call them build from Wormhole's
  own code, and one that calls them still fails (the worker then compiles the program at level 0, saying so).

Kernels built that way carry Wormhole arch tags but are linked against Blackhole's libraries and 0.81.1's
Wormhole memory map (not the plugin's tt-metal commit): they are never run, and every compile made with them
says so (`stand_in` -> `StandIn`, carried by the worker's result and ``ProgramCheck.stand_in``).

Nothing here imports torch or any other ``wancompile`` module: the worker (`wancompile.tt.worker`) loads this
file by its path, so it also runs from an interpreter that has only jax and the plugin. Progress goes to
stderr as lines starting with `PROGRESS`, which `wancompile.tt.env` passes through while the worker runs.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Optional

TTNN = "ttnn==0.81.1"  # the wheel whose Wormhole folders are grafted (cp310/cp312 only: downloaded, never installed)
# the plugin's runtime assets lack these (paths relative to the assets folder, and to the wheel's ``ttnn/``)
FOLDERS = (
    "tt_metal/hw/inc/internal/tt-1xx/wormhole",
    "runtime/hw/lib/wormhole",
    "runtime/hw/toolchain/wormhole",
)
# the SFPI compiler's multilib folders (under runtime/sfpi/compiler) that ``-mcpu=tt-wh`` looks in
COMPILER = "runtime/sfpi/compiler"
MULTILIB_DIRS = ("riscv-tt-elf/include/c++/15.1.0/riscv-tt-elf", "riscv-tt-elf/lib", "lib/gcc/riscv-tt-elf/15.1.0")
MULTILIB, MULTILIB_FROM = "wh-ilp32", "bh-ilp32"
# jax-tt-plugin 0.1.3's typecast API names SFPU functions only its Blackhole ckernels define (cast_fp16a_to_fp32,
# cast_fp16b_to_fp16a, cast_fp16a_to_fp16b): GCC 15 checks a template's non-dependent names when it parses it
# (-Wtemplate-body), so every Wormhole compute kernel that includes the header (typecast, layernorm, reduce, ...)
# fails to build, whatever it casts. `graft` writes a header that shadows the first ckernels header typecast.h
# includes (found first: the tt-1xx/wormhole folder precedes the ckernels' llk_api on the include path), includes
# the real one (#include_next) and declares each missing function as a template whose instantiation fails
# (static_assert): kernels that never call one build from Wormhole's own code; one that calls one does not build.
TYPECAST_API = "tt_metal/hw/inc/api/compute/eltwise_unary/typecast.h"
SHADOWED = "llk_sfpu/ckernel_sfpu_cast_fp32_to_fp16a.h"  # the ckernels header typecast.h includes first
SHADOW = f"{FOLDERS[0]}/{SHADOWED}"
WORMHOLE_CKERNELS = ("tt_metal/hw/ckernels/wormhole_b0", "tt_metal/tt-llk/tt_llk_wormhole_b0")
BLACKHOLE_CKERNELS = "tt_metal/hw/ckernels/blackhole"
MARKER = "wancompile-wormhole-graft.json"  # written into the assets folder by `graft`: what it did
PROGRESS = "wancompile tt: "  # the prefix of this module's progress lines on stderr
ASSETS_GLOB = "libtt-tt-metal-runtime-assets-*"


@dataclasses.dataclass(frozen=True)
class StandIn:
    """A compile whose Wormhole kernels were JIT-built from grafted sources: compile-only, never to be run."""

    chips: str  # the PJRT device kind the kernels were built for ("Wormhole_b0")
    sources: str  # where the grafted device headers, runtime objects and linker scripts came from ("ttnn==0.81.1")
    multilib: str  # the toolchain multilib the chips' builds ask for ("wh-ilp32") ...
    multilib_from: str  # ... and the one it points at ("bh-ilp32": Blackhole's libc, libstdc++ and libgcc)
    # SFPU functions the plugin's typecast API names that no Wormhole ckernels define, declared (`SHADOW`) so that
    # kernels including it build; none of them has Wormhole code: a kernel that calls one does not build
    declared_only: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "declared_only": list(self.declared_only)}

    @classmethod
    def from_json(cls, data: Optional[dict]) -> Optional["StandIn"]:
        """`to_json`'s inverse (None for null: no stand-in)."""
        return None if not data else cls(**{**data, "declared_only": tuple(data.get("declared_only", ()))})


class GraftFailed(RuntimeError):
    """The Wormhole sources could not be obtained or grafted; the message says why."""


def assets_dir(tmpdir: Optional[str] = None) -> Optional[Path]:
    """The plugin's unpacked runtime assets under `tmpdir` (default ``$TMPDIR``), None before its first start."""
    found = sorted(glob.glob(os.path.join(tmpdir or os.environ.get("TMPDIR", "/tmp"), ASSETS_GLOB)))
    return Path(found[-1]) if found else None


def missing(assets: Path) -> list[str]:
    """What of the Wormhole sources the assets lack: folders of `FOLDERS`, ``<dir>/wh-ilp32`` multilib entries, and
    `SHADOW` where the typecast API names SFPU functions no Wormhole ckernels define (`undefined_sfpu`)."""
    out = [d for d in FOLDERS if not (assets / d).exists()]
    compiler = assets / COMPILER
    if compiler.is_dir():
        out += [f"{d}/{MULTILIB}" for d in MULTILIB_DIRS if not os.path.lexists(compiler / d / MULTILIB)]
    if not (assets / SHADOW).exists() and undefined_sfpu(assets):
        out.append(SHADOW)
    return out


# the function a ckernels SFPU call macro calls: SFPU_UNARY_CALL(DST_SYNC, DST_ACCUM, FN, ...)
_CALLED = re.compile(r"SFPU_UNARY_CALL(?:_NO_TEMPLATE_ARGS)?\(\s*\w+\s*,\s*\w+\s*,\s*(\w+)\s*,")


def _headers(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*.h")) if p.is_file())


def undefined_sfpu(assets: Path) -> dict[str, str]:
    """The SFPU functions the typecast API (`TYPECAST_API`) calls that no Wormhole ckernels header defines, each
    with the template header of its Blackhole definition (the signature a declaration must have); {} where every
    one is defined, or the headers are not there."""
    assets = Path(assets)
    api = assets / TYPECAST_API
    if not api.is_file() or not all((assets / d).is_dir() for d in WORMHOLE_CKERNELS):
        return {}
    called = sorted(set(_CALLED.findall(api.read_text(errors="replace"))))
    wormhole = "\n".join(_headers(assets / d) for d in WORMHOLE_CKERNELS)
    lacking = [n for n in called if not re.search(rf"\b(?:void|auto)\s+{n}\s*\(", wormhole)]
    if not lacking:
        return {}
    blackhole = _headers(assets / BLACKHOLE_CKERNELS)
    out = {}
    for name in lacking:
        m = re.search(rf"(template\s*<[^<>]*>)\s*(?:inline\s+)?void\s+{name}\s*\(\s*\)", blackhole)
        if m and _first_value_parameter(m.group(1)):
            out[name] = " ".join(m.group(1).split())
    return out


def _first_value_parameter(template: str) -> str:
    """The name of a template header's first parameter where it is a value (``bool APPROXIMATION_MODE``), else ""."""
    m = re.match(r"template\s*<\s*(\w+)\s+(\w+)", template)
    return m.group(2) if m and m.group(1) not in ("typename", "class") else ""


def shadow_header(functions: dict[str, str]) -> str:
    """`SHADOW`'s text: the real header, then each of `functions` (name -> template header) declared as a template
    whose instantiation fails to compile, saying so."""
    lines = [
        "// Written by wancompile (wancompile/tt/wormhole.py) into jax-tt-plugin's unpacked runtime assets: a",
        "// compile-only stand-in. This plugin build's typecast API names SFPU functions that only its Blackhole",
        "// ckernels define; they are declared here, with no code, so that Wormhole kernels which include the API",
        "// but never call them build from Wormhole's own code. A kernel that calls one fails to build.",
        "#pragma once",
        f'#include_next "{SHADOWED}"',
        "",
        "namespace ckernel {",
        "namespace sfpu {",
        "template <auto...>",
        "inline constexpr bool wancompile_no_wormhole_code = false;",
    ]
    for name, template in sorted(functions.items()):
        first = _first_value_parameter(template)
        lines += [
            template,
            f"inline void {name}() {{",
            f"    static_assert(wancompile_no_wormhole_code<{first}>, "
            f'"{name}: no Wormhole code in this jax-tt-plugin build (declared by wancompile, compile-only)");',
            "}",
        ]
    lines += ["}  // namespace sfpu", "}  // namespace ckernel", ""]
    return "\n".join(lines)


def declared_only(assets: Path) -> tuple[str, ...]:
    """The functions `SHADOW` declares without code, () where there is no shadow."""
    try:
        text = (Path(assets) / SHADOW).read_text()
    except OSError:
        return ()
    return tuple(re.findall(r"^inline void (\w+)\(\)", text, re.MULTILINE))


def stand_in(assets: Optional[Path], chips: str = "Wormhole_b0") -> Optional[StandIn]:
    """The stand-in a level >= 1 compile for `chips` builds its kernels with, None where the assets' own sources
    serve (a multilib that is a folder of its own, or nothing unpacked)."""
    if assets is None or chips != "Wormhole_b0":
        return None
    links = [assets / COMPILER / d / MULTILIB for d in MULTILIB_DIRS]
    if not any(p.is_symlink() for p in links):
        return None
    target = os.readlink(next(p for p in links if p.is_symlink()))
    try:
        sources = json.loads((assets / MARKER).read_text()).get("sources", "")
    except (OSError, ValueError):
        sources = ""  # grafted by hand (tt-offline/scripts/wormhole_graft.sh): the marker is this module's
    return StandIn(chips, sources or "unrecorded", MULTILIB, os.path.basename(target), declared_only(assets))


def cache_dir() -> Path:
    """The tt cache folder (``WANCOMPILE_TT_CACHE``; the same default as `wancompile.tt.env.cache_dir`)."""
    return Path(os.environ.get("WANCOMPILE_TT_CACHE") or Path.home() / ".cache" / "wancompile" / "tt")


def sources_dir(cache: Path) -> Path:
    """Where the wheel's needed files are kept: ``<cache>/wormhole/ttnn-0.81.1/ttnn/<FOLDERS>``."""
    return Path(cache) / "wormhole" / TTNN.replace("==", "-")


def say(msg: str) -> None:
    print(PROGRESS + msg, file=sys.stderr, flush=True)


def fetch(cache: Path, log: Callable[[str], None] = say, python: str = sys.executable) -> Path:
    """The wheel's ``ttnn/`` folder holding `FOLDERS`, downloaded and extracted on the first call (into
    `sources_dir`); raises `GraftFailed` where pip cannot get the wheel (no network: pip's own last line)."""
    root = sources_dir(cache)
    done = root / "complete.json"
    if done.exists():
        return root / "ttnn"
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="download-", dir=root.parent) as tmp:
        cmd = [python, "-m", "pip", "download", TTNN, "--no-deps", "--python-version", "3.12"]
        cmd += ["--only-binary=:all:", "--retries", "2", "--timeout", "60", "--disable-pip-version-check", "-d", tmp]
        log(f"downloading the {TTNN} wheel for its Wormhole kernel sources (once, into {root.parent}; ~103 MB) ...")
        t = time.time()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise GraftFailed(f"pip download {TTNN} did not finish: {e}") from e
        wheels = glob.glob(os.path.join(tmp, "ttnn-*.whl"))
        if res.returncode != 0 or not wheels:
            lines = [x for x in (res.stderr or res.stdout or "").splitlines() if x.strip() and "is ignored" not in x]
            raise GraftFailed(f"pip download {TTNN} failed: {lines[-1].strip() if lines else f'exit {res.returncode}'}")
        size = os.path.getsize(wheels[0])
        log(f"downloaded {os.path.basename(wheels[0])}: {size / 1e6:.1f} MB in {time.time() - t:.1f} s")
        staged = Path(tmp) / "extracted"
        n = _extract(Path(wheels[0]), staged)
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staged, root)
        (root / "complete.json").write_text(
            json.dumps({"wheel": os.path.basename(wheels[0]), "wheel_bytes": size, "files": n, "folders": FOLDERS})
        )
        log(f"kept its {n} Wormhole files in {root} (the wheel is deleted)")
    return root / "ttnn"


def _extract(wheel: Path, dst: Path) -> int:
    """Extract the wheel's ``ttnn/<FOLDERS>`` members into `dst`; returns how many files."""
    prefixes = tuple(f"ttnn/{d}/" for d in FOLDERS)
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.infolist() if m.filename.startswith(prefixes) and not m.is_dir()]
            for d in FOLDERS:
                if not any(m.filename.startswith(f"ttnn/{d}/") for m in members):
                    raise GraftFailed(f"{wheel.name} has no ttnn/{d}")
            for m in members:
                z.extract(m, dst)
    except zipfile.BadZipFile as e:
        raise GraftFailed(f"{wheel.name} is not a wheel: {e}") from e
    return len(members)


def graft(assets: Path, cache: Optional[Path] = None, log: Callable[[str], None] = say) -> list[str]:
    """Fill in what `missing` finds: copy the folders from the wheel (`fetch`), link the multilib, write the
    `SHADOW` header; writes `MARKER` into `assets`. Returns what was done (empty where nothing was missing). Raises `GraftFailed`."""
    assets = Path(assets)
    todo = missing(assets)
    if not todo:
        return []
    if not (assets / COMPILER).is_dir():
        raise GraftFailed(f"{assets} holds no SFPI compiler ({COMPILER})")
    done: list[str] = []
    folders = [d for d in FOLDERS if d in todo]
    if folders:
        ttnn = fetch(cache if cache is not None else cache_dir(), log)
        for d in folders:
            staged = assets / f"{d}.partial"  # renamed into place whole: a crash leaves no half folder
            shutil.rmtree(staged, ignore_errors=True)
            shutil.copytree(ttnn / d, staged, symlinks=True)
            os.replace(staged, assets / d)
            done.append(f"copied {d}")
            log(f"grafted {d} from {TTNN}")
    for d in MULTILIB_DIRS:
        link = assets / COMPILER / d / MULTILIB
        if f"{d}/{MULTILIB}" in todo:
            if not (assets / COMPILER / d / MULTILIB_FROM).exists():
                raise GraftFailed(f"{assets / COMPILER / d} has no {MULTILIB_FROM} to point {MULTILIB} at")
            os.symlink(MULTILIB_FROM, link)
            done.append(f"linked {d}/{MULTILIB} -> {MULTILIB_FROM}")
            log(f"linked {COMPILER}/{d}/{MULTILIB} -> {MULTILIB_FROM} (compile-only: Blackhole's libraries)")
    if SHADOW in todo:
        functions = undefined_sfpu(assets)
        (assets / SHADOW).parent.mkdir(parents=True, exist_ok=True)
        staged = assets / f"{SHADOW}.partial"
        staged.write_text(shadow_header(functions))
        os.replace(staged, assets / SHADOW)
        done.append(f"declared {', '.join(sorted(functions))} in {SHADOW}")
        log(f"declared {', '.join(sorted(functions))} (named by the typecast API, no Wormhole code) in {SHADOW}")
    (assets / MARKER).write_text(
        json.dumps({"sources": TTNN, "multilib": MULTILIB, "multilib_from": MULTILIB_FROM, "done": done}, indent=1)
    )
    return done


def ensure(chips: str, tmpdir: Optional[str] = None, cache: Optional[Path] = None, log=say) -> str:
    """Before a level >= 1 compile for `chips`: graft where the unpacked assets lack Wormhole's sources. Returns
    "" where the assets can build the chips' kernels (now or already), else why not (`GraftFailed`'s message)."""
    assets = assets_dir(tmpdir)
    if chips != "Wormhole_b0" or assets is None or not missing(assets):
        return ""
    try:
        graft(assets, cache, log)
    except (GraftFailed, OSError) as e:
        log(f"Wormhole graft failed: {e}")
        return str(e)
    return ""


def kernel_sources(kind: str) -> tuple[str, Optional[dict]]:
    """Before a compile at optimization_level >= 1 for `kind`'s chips: why it must be made at level 0 instead ("":
    it need not), and the stand-in its kernels are built with (`StandIn` as JSON; None: the plugin's own sources).
    Wormhole's missing sources are grafted first (`ensure`: a download on the first run); where they cannot be
    obtained, level 0 with `missing_kernel_sources`'s reason and what failed."""
    failed = ensure(kind)
    why = missing_kernel_sources(kind)
    if why:
        return why + (f" (obtaining them failed: {failed})" if failed else ""), None
    found = stand_in(assets_dir(), kind)
    return "", None if found is None else found.to_json()


# the op model's refusal of an op whose kernel did not build: "Operation ttnn.typecast failed validation
# (original error: MetalBackendError - Op constraint query failed with error: TT_THROW @ ...program.cpp:344"
_UNBUILT = re.compile(r"Operation (ttnn\.\w+) failed validation .*TT_THROW")


def unbuilt_kernel(error: str, since: float) -> str:
    """Why a level >= 1 compile refused by `error` is made at level 0 instead, where the op model refused an op
    because one of its kernels did not build from the stand-in sources: the op, and the first error of the newest
    kernel build log written since `since` (``$TT_METAL_CACHE/tt-metal-cache*/kernels/<kernel>/<hash>/<core>/*.log``);
    "" for any other error."""
    m = _UNBUILT.search(error)
    if not m:
        return ""
    logs = glob.glob(
        os.path.join(os.environ.get("TT_METAL_CACHE", ""), "tt-metal-cache*", "kernels", "*", "*", "*", "*.log")
    )
    found = []
    for path in logs:
        try:
            if os.path.getmtime(path) < since or not os.path.getsize(path):
                continue
            said = next((x.strip() for x in open(path, errors="replace") if " error: " in x), "")
        except OSError:
            continue
        if said:
            found.append((os.path.getmtime(path), path, said))
    if not found:
        return ""
    _, path, said = max(found)
    kernel, _, core = Path(path).parent.parts[-3:]
    return (
        f"{m.group(1)}'s kernels do not build for Wormhole from the stand-in sources ({kernel} on {core}: "
        f"{said.split(' error: ', 1)[1]}), so fused attention is decomposed at level 0"
    )


# the chip family's folder of device headers in tt-metal's runtime assets, by PJRT device kind
_ARCH_HEADERS = {"Wormhole_b0": "wormhole", "Blackhole": "blackhole"}


def missing_kernel_sources(kind: str) -> str:
    """Why this plugin build cannot compile `kind`'s chips at optimization_level >= 1, or "": its unpacked assets
    have no device headers for them (jax-tt-plugin 0.1.3's: Blackhole's only, until `graft`). Level 0 builds none."""
    folder = _ARCH_HEADERS.get(kind)
    assets = assets_dir()
    if folder is None or assets is None:
        return ""
    if (assets / "tt_metal" / "hw" / "inc" / "internal" / "tt-1xx" / folder).is_dir():
        return ""
    return (
        f"{kind} kernel sources missing from this jax-tt-plugin build (its runtime assets have no tt-1xx/{folder} "
        "device headers, and level 1's op model JIT-builds the chips' kernels), so fused attention is decomposed at "
        "level 0; a plugin built with them compiles it at level 1"
    )
