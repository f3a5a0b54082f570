"""The tt-mlir side of the Tenstorrent path, run as its own process (``python -m wancompile.tt.worker``).

It imports jax/jaxlib and (for ``compile``) Tenstorrent's PJRT plugin, never torch or torch_xla: the
plugin bundles its own MLIR and XLA, and keeping it out of the process that holds torch_xla's avoids
two copies of those in one address space (and lets the plugin live in another environment when its
jax clashes with the user's; `wancompile.tt.env`).

``shardy IN.mlirbc SHARDINGS.json OUT.tt.mlir [ARGUMENTS.json]``
    torch_xla's program as a StableHLO portable artifact (VHLO bytecode: readable by any later MLIR,
    so boolean constants and every other attribute arrive exactly; torch_xla's *text* bit-packs i1
    data, which jaxlib's and tt-mlir's MLIR refuse) → the Shardy form tt-mlir partitions: an
    ``sdy.mesh`` with the plan's axis names and sizes, an ``sdy.sharding`` on every argument and
    result, an ``sdy.sharding_constraint`` for every constraint. Each GSPMD annotation torch_xla
    wrote is looked up in SHARDINGS.json — the plan's specs, keyed by the annotation torch_xla makes of
    each (`wancompile.tt.export`) — so every Shardy sharding is a plan's spec; an annotation the plan
    did not make is an error, never a guess. Dimension shardings are closed: Shardy may not add axes.
    With ARGUMENTS.json (per argument, the parameters it holds), the arguments that hold parameters
    are marked as tt-xla marks them (`wancompile.tt.parameters`), so tt-mlir computes what depends on
    them alone once (const-eval) instead of every call.

``unannotated MODULE.tt.mlir OUT.tt.mlir``
    the same module with the plan taken out: every ``sdy.sharding_constraint`` removed (its value read
    directly), every argument, result and op sharding replicated. tt-mlir compiles it as one chip's
    program on every chip: the program its own patterns see without pins (`wancompile.tt.check`
    compares the two per block).

``compile MODULE.tt.mlir SYSTEM.ttsys EXPORT_DIR [OPTIONS_JSON]``
    compile-only through tt-mlir (``TT_COMPILE_ONLY_SYSTEM_DESC``: no device is opened): StableHLO →
    TTIR → TTNN → flatbuffer for the descriptor's chips, every IR stage under ``EXPORT_DIR/irs``, TTNN's
    perf metrics beside it. Prints one JSON object: ``ok``, ``error`` (the compiler's first error line),
    ``seconds``, ``ttnn`` (path of the final TTNN IR), ``metrics`` (path of the metrics JSON),
    ``peak_rss_bytes`` (the compiler process's peak resident memory), ``parameter_arguments``: how many
    arguments it compiled marked ``parameter``, ``unmarked_arguments``: the
    arguments marked ``parameter`` whose const-eval function held a collective (a weight the plan gathers
    per use), compiled again without the mark (written as compiled to ``EXPORT_DIR/compiled.tt.mlir``),
    ``options``, ``level_0_because`` and ``stand_in``: at level >= 1, the chips' kernel sources
    (`wancompile.tt.wormhole.kernel_sources`: Wormhole's grafted on the first run, a compile-only stand-in).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time

if __package__:  # python -m wancompile.tt.worker
    from wancompile.tt import constants, parameters
else:  # run by path (`wancompile.tt.env.run_worker`): its directory is sys.path[0], and its interpreter
    # (WANCOMPILE_TT_PYTHON) may have jax and the plugin only, no wancompile: the siblings it needs import
    # nothing but jaxlib and the standard library
    import constants
    import parameters

walk = constants.walk


def shardy(src: str, shardings_path: str, dst: str, arguments_path: str = "") -> dict:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy, stablehlo

    spec = json.load(open(shardings_path))
    names, sizes = spec["axis_names"], spec["shape"]
    table: dict[str, list[list[str]]] = spec["shardings"]
    with ir.Context() as ctx, ir.Location.unknown():
        sdy.register_dialect(ctx)
        module = stablehlo.deserialize_portable_artifact(ctx, open(src, "rb").read())

        def sharding(text: str, rank: int):
            if text not in table and text != "{replicated}":
                raise SystemExit(f"annotation {text} is not one of the plan's specs (shardings: {shardings_path})")
            dims = table[text] if text != "{replicated}" else [[]] * rank
            if len(dims) != rank:
                raise SystemExit(f"annotation {text} has {len(dims)} dims, the value {rank}")
            return sdy.TensorShardingAttr.get(
                "mesh", [sdy.DimensionShardingAttr.get([sdy.AxisRefAttr.get(a) for a in d], True) for d in dims]
            )

        def convert_attrs(attrs, types):
            out = []
            for d, ty in zip(attrs, types):
                entries = {a.name: a.attr for a in ir.DictAttr(d)}
                gspmd = entries.pop("mhlo.sharding", None)
                if gspmd is not None:
                    entries["sdy.sharding"] = sharding(ir.StringAttr(gspmd).value, ir.RankedTensorType(ty).rank)
                out.append(ir.DictAttr.get(entries))
            return ir.ArrayAttr.get(out)

        counts = {"arguments": 0, "results": 0, "constraints": 0}
        body = module.body
        with ir.InsertionPoint.at_block_begin(body):
            sdy.MeshOp("mesh", sdy.MeshAttr.get([sdy.MeshAxisAttr.get(n, s) for n, s in zip(names, sizes)]))
        module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(32), int(_prod(sizes))
        )
        module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
        for op in body.operations:
            if op.operation.name != "func.func":
                continue
            fn = op.operation
            fty = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
            if "arg_attrs" in fn.attributes:
                fn.attributes["arg_attrs"] = convert_attrs(fn.attributes["arg_attrs"], fty.inputs)
                counts["arguments"] += len(fty.inputs)
            if ir.StringAttr(fn.attributes["sym_name"]).value == "main" and spec.get("unannotated_arguments"):
                # a traced-only program's placeholders (values never read) carry no annotation: replicated
                attrs = fn.attributes["arg_attrs"] if "arg_attrs" in fn.attributes else [None] * len(fty.inputs)
                out = []
                for d, ty in zip(attrs, fty.inputs):
                    entries = {a.name: a.attr for a in ir.DictAttr(d)} if d is not None else {}
                    if "sdy.sharding" not in entries:
                        entries["sdy.sharding"] = sharding("{replicated}", ir.RankedTensorType(ty).rank)
                        counts["placeholder_arguments"] = counts.get("placeholder_arguments", 0) + 1
                    out.append(ir.DictAttr.get(entries))
                fn.attributes["arg_attrs"] = ir.ArrayAttr.get(out)
            if "res_attrs" in fn.attributes:
                fn.attributes["res_attrs"] = convert_attrs(fn.attributes["res_attrs"], fty.results)
                counts["results"] += len(fty.results)
            for block in fn.regions[0].blocks:
                for inner in list(block.operations):
                    o = inner.operation
                    if o.name != "stablehlo.custom_call":
                        continue
                    if ir.StringAttr(o.attributes["call_target_name"]).value != "Sharding":
                        continue
                    text = ir.StringAttr(o.attributes["mhlo.sharding"]).value
                    value = o.operands[0]
                    with ir.InsertionPoint(o):
                        c = sdy.ShardingConstraintOp(value, sharding(text, ir.RankedTensorType(value.type).rank))
                    o.results[0].replace_all_uses_with(c.result)
                    o.erase()
                    counts["constraints"] += 1
        for o in walk(module.operation):  # a sharding torch_xla set on the op itself (a marked value it made)
            if "mhlo.sharding" in o.attributes and len(o.results) == 1:
                text = ir.StringAttr(o.attributes["mhlo.sharding"]).value
                per_value = sdy.TensorShardingPerValueAttr.get(
                    [sharding(text, ir.RankedTensorType(o.results[0].type).rank)]
                )
                del o.attributes["mhlo.sharding"]
                o.attributes["sdy.sharding"] = per_value
                counts["constraints"] += 1
        if arguments_path:
            counts.update(parameters.mark(module, json.load(open(arguments_path))))
        counts["constant_uses_pinned"] = constants.pin(module.operation)
        left = [o for o in walk(module.operation) if "mhlo.sharding" in o.attributes]
        if left:
            raise SystemExit(f"{len(left)} op(s) keep a GSPMD annotation after the conversion, e.g. {left[0].name}")
        if not module.operation.verify():
            raise SystemExit("the Shardy module does not verify")
        with open(dst, "w") as f:
            f.write(module.operation.get_asm(large_elements_limit=None, enable_debug_info=False))
    return counts


def unannotated(src: str, dst: str) -> dict:
    """The ``unannotated`` verb (module docstring); returns how many constraints and shardings it took out."""
    from jax._src.interpreters.mlir import make_ir_context  # every dialect a jax program holds, registered
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy

    counts = {"constraints": 0, "shardings": 0}
    with make_ir_context() as ctx, ir.Location.unknown():
        sdy.register_dialect(ctx)
        module = ir.Module.parse(open(src).read())

        def replicated(ty):
            rank = ir.RankedTensorType(ty).rank
            return sdy.TensorShardingAttr.get("mesh", [sdy.DimensionShardingAttr.get([], True)] * rank)

        def strip(attrs, types):
            out = []
            for d, ty in zip(attrs, types):
                entries = {a.name: a.attr for a in ir.DictAttr(d)}
                if "sdy.sharding" in entries:
                    entries["sdy.sharding"] = replicated(ty)
                    counts["shardings"] += 1
                out.append(ir.DictAttr.get(entries))
            return ir.ArrayAttr.get(out)

        for o in list(walk(module.operation)):
            if o.name == "sdy.sharding_constraint":
                o.results[0].replace_all_uses_with(o.operands[0])
                o.erase()
                counts["constraints"] += 1
            elif o.name == "func.func":
                fty = ir.FunctionType(ir.TypeAttr(o.attributes["function_type"]).value)
                for key, types in (("arg_attrs", fty.inputs), ("res_attrs", fty.results)):
                    if key in o.attributes:
                        o.attributes[key] = strip(o.attributes[key], types)
            elif "sdy.sharding" in o.attributes:
                del o.attributes["sdy.sharding"]
                counts["shardings"] += 1
        if not module.operation.verify():
            raise SystemExit("the unannotated module does not verify")
        with open(dst, "w") as f:
            f.write(module.operation.get_asm(large_elements_limit=None, enable_debug_info=False))
    return counts


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def compile_module(src: str, system_desc: str, export: str, options_json: str = "{}") -> dict:
    """Compile-only through the plugin with the compile options `options_json` (a JSON object of tt-xla's
    compile-option strings, e.g. ``{"optimization_level": "1"}``; default level 0); returns the result
    object (see the module docstring)."""
    os.environ["TT_COMPILE_ONLY_SYSTEM_DESC"] = system_desc
    os.environ.setdefault("JAX_PLATFORMS", "tt")
    import numpy as np
    from jax._src import compiler, xla_bridge
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    text = open(src).read()
    backend = xla_bridge.get_backend("tt")
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        unsafe = spatial_convs(module)
        if unsafe:
            return _result(
                False,
                f"refused: {len(unsafe)} convolution(s) read an input split on a spatial dim their window spans "
                f"({unsafe[0]}); tt-mlir exchanges no halo there (tt-mlir #8216), each chip would pad its tile "
                "with zeros. Plan the VAE for target tt-mlir (no spatial conv splits) or use channel Megatron",
                0,
                export,
            )
        n = int(module.operation.attributes["mhlo.num_partitions"].value)
        devices = backend.devices()
        if len(devices) < n:
            return _result(False, f"system {system_desc} has {len(devices)} chip(s), the program needs {n}", 0, export)
        picked = os.environ.get("WANCOMPILE_TT_DEVICES")
        devs = [devices[int(i)] for i in picked.split(",")] if picked else devices[:n]
        if os.environ.get("WANCOMPILE_TT_SHOW_DEVICES"):
            print("DEVICES", [(d.id, getattr(d, "coords", None), str(d)) for d in devices], flush=True)
        asked = json.loads(options_json)
        level_1 = int(asked.get("optimization_level", "0")) >= 1
        why, stand_in = _wormhole().kernel_sources(devs[0].device_kind) if level_1 else ("", None)
        if why:
            asked = {**asked, "optimization_level": "0"}
        metrics = os.path.join(export, "perf_metrics.json")
        options = compiler.get_compile_options(
            num_replicas=1,
            num_partitions=n,
            device_assignment=np.array(devs).reshape(1, n),
            env_options_overrides={
                "export_path": export,
                "export_model_name": "program",
                "optimization_level": "0",
                **asked,
                "ttnn_perf_metrics_enabled": "true",
                "ttnn_perf_metrics_output_file": metrics,
            },
            backend=backend,
        )
        options.executable_build_options.use_shardy_partitioner = True
        t = time.time()
        unmarked: set = set()
        while True:
            _clear(export)  # `_result` reads the newest IRs there: none of an earlier compile
            try:
                compiler.backend_compile_and_load(backend, module, xc.DeviceList(tuple(devs)), options, [])
            except Exception as e:  # the plugin's error: its first line names the failing pass or op
                error = _first_line(str(e))
                unbuilt = _wormhole().unbuilt_kernel(error, t) if stand_in is not None else ""
                if unbuilt:  # a kernel the stand-in sources cannot build: the program at level 0, saying why
                    level_0 = json.dumps({**asked, "optimization_level": "0"})
                    return {**compile_module(src, system_desc, export, level_0), "level_0_because": unbuilt}
                failed = _result(False, error, time.time() - t, export)
                return {**failed, "options": asked, "level_0_because": why, "stand_in": stand_in}
            result = _result(True, "", time.time() - t, export)
            # a weight the plan gathers per use (FSDP), marked a parameter, is gathered once in a const-eval
            # function and kept whole: unmarked, its gather runs every call as the plan has it
            hoisted = parameters.hoisted_collectives(open(result["ttnn"]).read()) - unmarked
            if not hoisted or not parameters.unmark(module, hoisted):
                break
            unmarked |= hoisted
            with open(os.path.join(export, "compiled.tt.mlir"), "w") as f:  # the module as compiled
                f.write(module.operation.get_asm(large_elements_limit=None, enable_debug_info=False))
        return {
            **result,
            "parameter_arguments": len(parameters.marks(module)),
            "unmarked_arguments": sorted(unmarked),
            "options": asked,
            "level_0_because": why,
            "stand_in": stand_in,
        }


def _wormhole():
    """`wancompile.tt.wormhole`, imported as this module's siblings are (by path when run as a script)."""
    if __package__:
        from wancompile.tt import wormhole
    else:
        import wormhole
    return wormhole


def missing_kernel_sources(kind: str) -> str:
    return _wormhole().missing_kernel_sources(kind)


def _clear(export: str) -> None:
    shutil.rmtree(os.path.join(export, "irs"), ignore_errors=True)
    for path in glob.glob(os.path.join(export, "perf_metrics*.json")) + glob.glob(os.path.join(export, "*.ttnn")):
        os.remove(path)


def spatial_convs(module) -> list[str]:
    """Convolutions whose input is split (by its constraint or argument sharding) on a spatial dim that
    the kernel spans (size > 1): one line each, with the op's location."""
    import re

    from jaxlib.mlir import ir

    found = []
    for o in walk(module.operation):
        if o.name != "stablehlo.convolution":
            continue
        numbers = str(o.attributes["dimension_numbers"])  # #stablehlo.conv<[b, f, 0, 1, 2]x[o, i, 0, 1, 2]->...>
        m = re.search(r"\[([^\]]*)\]x\[([^\]]*)\]", numbers)
        if not m:
            continue
        lhs = [x.strip() for x in m.group(1).split(",")]
        rhs = [x.strip() for x in m.group(2).split(",")]
        kernel = ir.RankedTensorType(o.operands[1].type).shape
        owner = o.operands[0].owner
        sharding = ""
        if isinstance(owner, ir.Operation) or hasattr(owner, "name"):
            op = owner.operation if hasattr(owner, "operation") else owner
            if op.name == "sdy.sharding_constraint":
                sharding = str(op.attributes["sharding"])
        dims = re.findall(r"\{([^}]*)\}", sharding.split("[", 1)[1]) if "[" in sharding else []
        for pos, tag in enumerate(lhs):
            if not tag.isdigit() or pos >= len(dims) or not dims[pos].strip():
                continue
            if kernel[rhs.index(tag)] > 1:
                found.append(f"{o.location}: input dim {pos} split over {dims[pos].strip()}")
                break
    return found


def peak_rss_bytes() -> int:
    """This process's peak resident memory since it started its program (``VmHWM``: unlike
    ``getrusage``'s maxrss, not inherited across fork and exec), 0 where /proc has no such line."""
    try:
        with open("/proc/self/status") as f:
            line = next((x for x in f if x.startswith("VmHWM:")), "")
    except OSError:
        return 0
    return int(line.split()[1]) * 1024 if line else 0


def _first_line(msg: str) -> str:
    lines = [x.strip() for x in msg.splitlines() if x.strip()]
    return lines[0] if lines else msg


def _result(ok: bool, error: str, seconds: float, export: str) -> dict:
    ttnn = sorted(p for p in glob.glob(os.path.join(export, "irs", "ttnn_*.mlir")) if "ttnn_runtime" not in p)
    metrics = sorted(glob.glob(os.path.join(export, "perf_metrics*.json")))
    return {
        "ok": ok,
        "error": error,
        "seconds": round(seconds, 3),
        "ttnn": ttnn[-1] if ttnn else None,
        "metrics": metrics[-1] if metrics else None,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def main(argv: list[str]) -> int:
    verb, args = argv[0], argv[1:]
    if verb == "shardy":
        print(json.dumps(shardy(*args)))
        return 0
    if verb == "unannotated":
        print(json.dumps(unannotated(*args)))
        return 0
    if verb == "compile":
        res = compile_module(*args)
        sys.stdout.flush()
        print("TT-CHECK " + json.dumps(res), flush=True)
        return 0
    raise SystemExit(f"unknown verb {verb!r}: shardy | unannotated | compile")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
