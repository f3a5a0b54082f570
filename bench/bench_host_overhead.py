"""Per-call host overhead of a compiled 40-block DiT: wan_autoshard vs torch_xla's openxla_eval replay.

    python bench/bench_host_overhead.py [--repeats 30] [--layers 40]

The model is the tiny config (4 heads x 16, FFN 96) with 40 blocks, so the device work per call is
almost nothing and wall time per call is host time: what the backend does around the compiled program.
Two processes, because the virtual device count is fixed per process:

- 1 device (mesh 1x1): ``wan_autoshard`` vs ``openxla_eval`` (torch_xla's dynamo bridge, which
  replays its compiled graph by hash), inputs and weights on the XLA device for both;
- 8 devices (mesh 2x4): ``wan_autoshard`` under the auto plan and the tt-xla hand plan vs
  ``openxla_eval`` running the same model unsharded (the bridge has no sharding of its own here).

Each row is also run with host (CPU) inputs and outputs, as a diffusers pipeline calls it (the
transfers are part of what a user pays). All variants of one process are compiled first, then called
``repeats`` times round-robin, so machine noise hits all alike. Two medians per call: host time (until
the call returns: dispatch is asynchronous, so this is what the backend costs the host) and wall time
(until the result is ready: adds the program's execution, which differs between backends because
wancompile runs its legalized graph, e.g. LayerNorm as explicit reductions), each with its ratio to
``openxla_eval`` on XLA inputs. Host inputs include the host-to-device transfer and, on the way
back, the device-to-host copy (host time then includes waiting for the result).
Note that openxla_eval's numbers are not a correctness reference (docs/numerics.md): only its host
cost is compared here.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(devices: int, repeats: int, layers: int) -> list[dict]:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    import wancompile  # noqa: F401  (SPMD on before the runtime starts)
    from wancompile.backend import last_program
    from wancompile.models import build_transformer, transformer_inputs

    model = build_transformer("tiny", num_layers=layers)
    host_inputs = transformer_inputs("tiny", "tiny", 9)
    dev = torch_xla.device()
    xla_inputs = {k: v.to(dev) for k, v in host_inputs.items()}
    mesh = "1x1" if devices == 1 else "2x4"
    variants = {"openxla_eval": ("openxla_eval", None)}
    variants["wan_autoshard auto"] = ("wan_autoshard", {"mesh": mesh})
    if devices > 1:
        variants["wan_autoshard tt-xla"] = ("wan_autoshard", {"mesh": mesh, "plan": "tt-xla"})

    calls, traces = {}, {}
    for name, (backend, options) in variants.items():
        torch._dynamo.reset()
        m = copy.deepcopy(model).to(dev)
        fn = torch.compile(m, backend=backend, options=options) if options else torch.compile(m, backend=backend)
        places = {"xla": xla_inputs} if backend == "openxla_eval" else {"xla": xla_inputs, "host": host_inputs}
        if backend == "wan_autoshard":  # host inputs need the host model (the backend shards and caches it)
            host_fn = torch.compile(copy.deepcopy(model), backend=backend, options=options)
        for place, inputs in places.items():
            f = host_fn if place == "host" else fn
            with torch.no_grad():
                for _ in range(3):  # compile, then settle
                    out = f(**inputs, return_dict=False)[0]
                    xm.wait_device_ops()
            calls[(name, place)] = (f, inputs)
            if backend == "wan_autoshard":
                traces[(name, place)] = last_program().traces
    host = {k: [] for k in calls}
    wall = {k: [] for k in calls}
    for _ in range(repeats):
        for key, (f, inputs) in calls.items():
            start = time.perf_counter()
            with torch.no_grad():
                out = f(**inputs, return_dict=False)[0]
            returned = time.perf_counter()
            if out.device.type == "xla":
                xm.wait_device_ops()
            host[key].append(returned - start)
            wall[key].append(time.perf_counter() - start)
    base_host = statistics.median(host[("openxla_eval", "xla")])
    base_wall = statistics.median(wall[("openxla_eval", "xla")])
    return [
        {
            "devices": devices,
            "mesh": mesh,
            "variant": name,
            "inputs": place,
            "host_ms": statistics.median(host[(name, place)]) * 1e3,
            "host_ratio": statistics.median(host[(name, place)]) / base_host,
            "wall_ms": statistics.median(w) * 1e3,
            "wall_ratio": statistics.median(w) / base_wall,
            "traces": traces.get((name, place)),
        }
        for (name, place), w in wall.items()
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("ROWS " + json.dumps(child(args.child, args.repeats, args.layers)))
        return
    rows = []
    for devices in (1, 8):
        env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(devices), XLA_USE_SPMD="1")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                str(devices),
                "--repeats",
                str(args.repeats),
                "--layers",
                str(args.layers),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            sys.exit(proc.stderr[-4000:])
        rows += json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS "))[5:])
    print(
        f"{args.layers}-block tiny-dim DiT, medians over {args.repeats} interleaved calls; ratios to "
        "openxla_eval on XLA inputs in the same process\n"
    )
    print(
        "| devices | mesh | backend / plan | inputs | host ms (call returns) | ratio | wall ms (result ready) "
        "| ratio | FX traces |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['devices']} | {r['mesh']} | {r['variant']} | {r['inputs']} | {r['host_ms']:.1f} | "
            f"{r['host_ratio']:.2f} | {r['wall_ms']:.1f} | {r['wall_ratio']:.2f} | "
            f"{'' if r['traces'] is None else r['traces']} |"
        )


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "bench-host-overhead.md", "Host overhead per call vs torch_xla's openxla_eval")
