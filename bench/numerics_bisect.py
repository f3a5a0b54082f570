"""Bisect the one-device XLA vs eager-CPU difference on a tiny Wan 2.2 DiT.

Usage (one XLA CPU device, no SPMD):

    PJRT_DEVICE=CPU PYTHONPATH=. python bench/numerics_bisect.py [--quick] [--json OUT] [--write]

What it does (see docs/numerics.md for the write-up):

1. End-to-end: eager CPU vs XLA through several paths (lazy eager XLA, dynamo ``openxla``,
   dynamo ``openxla_eval``, ``openxla_eval`` after the setitem-functionalization rewrite) at
   timesteps 0, 1, 500, 999, in fp32 and bf16.
2. Per-op local error: the dynamo FX graph is run node by node on CPU; every node is re-run on
   the XLA device with the *eager CPU values* of its inputs, and nodes are ranked by local error.
3. Accumulated-error bisection of the ``openxla_eval`` lowering: the FX graph truncated after
   node k is compiled with ``openxla_eval``; a binary search finds the first node whose value
   diverges from eager CPU.
4. The write-before-read check: for every in-place ``operator.setitem`` node, whether the
   graph the ``openxla_eval`` CPU-fallback partitioner hands to XLA reads the buffer before
   the write (it does, for diffusers' Wan ``apply_rotary_emb``).
"""

from __future__ import annotations

import argparse
import copy
import json
import operator
import os
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import contextlib

import numpy as np
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from rewrites._core import module_path

TIMESTEPS = (0, 1, 500, 999)
_nullctx = contextlib.nullcontext
# wancompile.models' "tiny" config, written out: this script compares plain torch_xla with eager and
# must not import wancompile (which switches the runtime to SPMD)
MODEL_KW = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=4,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=16,
    ffn_dim=96,
    num_layers=2,
    rope_max_seq_len=32,
)


# --------------------------------------------------------------------------------------------
# model, metrics
# --------------------------------------------------------------------------------------------
def build(dtype=torch.float32):
    from diffusers import WanTransformer3DModel
    from diffusers.utils import logging as dlogging

    dlogging.set_verbosity_error()  # the "keep these modules in float32" note on .to(bf16)

    torch.manual_seed(0)
    m = WanTransformer3DModel(**MODEL_KW).eval()
    x = torch.randn(1, 4, 3, 8, 8)
    enc = torch.randn(1, 7, 32)
    return m.to(dtype), x.to(dtype), enc.to(dtype)


def compare(out, ref):
    a = out.detach().cpu().double().flatten()
    b = ref.detach().cpu().double().flatten()
    maxabs = (a - b).abs().max().item()
    pcc = float(np.corrcoef(a.numpy(), b.numpy())[0, 1])
    return maxabs, pcc


# --------------------------------------------------------------------------------------------
# the fix: make in-place setitem explicit data flow (a pure FX rewrite)
# --------------------------------------------------------------------------------------------
_FRESH = {
    torch.empty_like,
    torch.zeros_like,
    torch.ones_like,
    torch.full_like,
    torch.empty,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.clone,
}


def setitem_out_of_place(buf, idx, val):
    out = buf.clone()
    out[idx] = val
    return out


def functionalize_setitem(gm: fx.GraphModule) -> int:
    """Rewrite ``operator.setitem(buf, idx, val)`` (dynamo's form of ``buf[idx] = val``) into
    ``buf2 = setitem_out_of_place(buf, idx, val)`` and point every later reader of ``buf`` at
    ``buf2``. The in-place write then is a data dependency, so no reordering of the graph (such
    as the topological sort in torch_xla's ``openxla_eval`` CPU-fallback partitioner) can move
    a read of ``buf`` before the write.

    Only applied where it is exact: ``buf`` is a fresh allocation (empty_like, zeros, clone...)
    and every other user of ``buf`` (views included) comes after its last write, so nothing can
    observe the buffer between writes. Returns the number of setitem nodes rewritten."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    writes: dict[fx.Node, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is operator.setitem and isinstance(node.args[0], fx.Node):
            writes.setdefault(node.args[0], []).append(node)
    n_rewritten = 0
    for buf, sets in writes.items():
        fresh = (buf.op == "call_function" and buf.target in _FRESH) or (
            buf.op == "call_method" and buf.target == "clone"
        )
        if not fresh:
            continue
        last = max(order[w] for w in sets)
        others = [u for u in buf.users if u not in sets]
        if any(order[u] < last for u in others) or any(w.args[0] is not buf for w in sets):
            continue  # something can observe buf between writes: leave it in place
        cur = buf
        for w in sorted(sets, key=order.__getitem__):
            with gm.graph.inserting_after(w):
                new = gm.graph.call_function(setitem_out_of_place, (cur,) + tuple(w.args[1:]))
            new.meta = dict(w.meta)
            gm.graph.erase_node(w)
            cur = new
            n_rewritten += 1
        for u in others:
            u.replace_input_with(buf, cur)
    gm.graph.lint()
    gm.recompile()
    return n_rewritten


class stable_partition_order:
    """Context manager: make ``topo_sort`` (used by torch_xla's CPU-fallback partitioner and by
    torch.fx's ``fuse_by_partitions``) return the nodes in their original graph order, which is
    already topological *and* respects side effects. The upstream ``topo_sort`` is Kahn's
    algorithm over data edges only, so an in-place write that no later node consumes as data
    can be scheduled after a read of the same buffer."""

    @staticmethod
    def topo_sort(nodes):
        nodes = list(nodes)
        if not nodes:
            return nodes
        pos = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
        return sorted(nodes, key=pos.__getitem__)

    def __enter__(self):
        import torch.fx.passes.utils.fuser_utils as fu
        from torch_xla._dynamo import dynamo_bridge as db

        self._saved = (fu.topo_sort, db.topo_sort)
        fu.topo_sort = db.topo_sort = self.topo_sort
        return self

    def __exit__(self, *exc):
        import torch.fx.passes.utils.fuser_utils as fu
        from torch_xla._dynamo import dynamo_bridge as db

        fu.topo_sort, db.topo_sort = self._saved
        return False


def setitem_read_before_write(gm: fx.GraphModule):
    """Nodes that read a setitem'd buffer before the write, in ``gm``'s node order."""
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    bad = []
    for n in nodes:
        if n.op == "call_function" and n.target is operator.setitem and isinstance(n.args[0], fx.Node):
            for r in n.args[0].users:
                if r is not n and r.target is not operator.setitem and pos[r] < pos[n]:
                    bad.append((n.name, r.name, pos[n], pos[r]))
    return bad


# --------------------------------------------------------------------------------------------
# capture
# --------------------------------------------------------------------------------------------
def capture(module, *args):
    """Dynamo FX graph + the real example inputs, via a recording backend."""
    cap = {}

    def rec(gm, ex):
        cap["gm"], cap["ex"] = gm, list(ex)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(module, backend=rec, fullgraph=True)(*args, return_dict=False)
    return cap["gm"], cap["ex"]


def graph_to_cpu(gm):
    """Copy of gm whose tensor constructors (arange(device=xla)...) build on CPU."""
    g = copy.deepcopy(gm.graph)
    for n in g.nodes:
        if isinstance(n.kwargs.get("device"), torch.device):
            n.kwargs = {**n.kwargs, "device": torch.device("cpu")}
    return fx.GraphModule(gm, g)


# --------------------------------------------------------------------------------------------
# 1. end to end
# --------------------------------------------------------------------------------------------
def end_to_end(dtype=torch.float32, timesteps=TIMESTEPS, paths=None):
    import torch_xla

    dev = torch_xla.device()
    m, x, enc = build(dtype)
    mx = copy.deepcopy(m).to(dev)
    m32, x32, enc32 = build(torch.float32)
    paths = paths or [
        "eager_xla",
        "openxla",
        "openxla_eval",
        "openxla_eval+functionalize_setitem",
        "openxla_eval+stable_partition_order",
    ]
    rows = []

    def fixed_backend(gm, ex):
        from torch._dynamo.backends.torchxla import openxla_eval

        functionalize_setitem(gm)
        return openxla_eval(gm, ex)

    for path in paths:
        torch._dynamo.reset()
        if path == "eager_xla":
            fn = mx
        elif path == "openxla_eval+stable_partition_order":
            fn = torch.compile(mx, backend="openxla_eval", fullgraph=True)
        elif path == "openxla_eval+functionalize_setitem":
            fn = torch.compile(mx, backend=fixed_backend, fullgraph=True)
        else:
            fn = torch.compile(mx, backend=path, fullgraph=True)
        for ts in timesteps:
            t = torch.tensor([ts])
            with torch.no_grad(), stable_partition_order() if "stable" in path else _nullctx():
                ref = m(x, t, enc, return_dict=False)[0]
                out = fn(x.to(dev), t.to(dev), enc.to(dev), return_dict=False)[0].cpu()
                row = dict(dtype=str(dtype).replace("torch.", ""), path=path, t=ts)
                row["maxabs"], row["pcc"] = compare(out, ref)
                if dtype != torch.float32:
                    ref32 = m32(x32, t, enc32, return_dict=False)[0]
                    row["maxabs_vs_fp32_cpu"], row["pcc_vs_fp32_cpu"] = compare(out, ref32)
                    row["floor_maxabs"], row["floor_pcc"] = compare(ref, ref32)
            rows.append(row)
    torch._dynamo.reset()
    return rows


def emulate_bug_on_cpu(ts=500):
    """Run the dynamo graph on CPU in the order openxla_eval's partitioner uses (each rope
    setitem after the read of its buffer; XLA's empty_like is zeros): i.e. q and k of every
    self-attention become zero. Compare with openxla_eval."""
    import torch_xla
    from torch.fx.passes.utils.fuser_utils import topo_sort

    dev = torch_xla.device()
    m, x, enc = build()
    mx = copy.deepcopy(m).to(dev)
    t = torch.tensor([ts])
    gm, ex = capture(mx, x.to(dev), t.to(dev), enc.to(dev))
    g = graph_to_cpu(gm)
    for n in g.graph.nodes:
        if n.target is torch.empty_like:
            n.target = torch.zeros_like
    nodes = [n for n in g.graph.nodes if n.op not in ("placeholder", "output")]
    order = topo_sort(nodes)
    new = fx.Graph()
    env = {}
    for n in g.graph.nodes:
        if n.op == "placeholder":
            env[n] = new.node_copy(n, lambda a: env[a])
    for n in order:
        env[n] = new.node_copy(n, lambda a: env[a])
    out = [n for n in g.graph.nodes if n.op == "output"][0]
    new.node_copy(out, lambda a: env[a])
    emu = fx.GraphModule(g, new)
    with torch.no_grad():
        y_emu = emu(*[e.cpu() for e in ex])[0]
        y_ref = m(x, t, enc, return_dict=False)[0]
        torch._dynamo.reset()
        y_x = torch.compile(mx, backend="openxla_eval", fullgraph=True)(
            x.to(dev), t.to(dev), enc.to(dev), return_dict=False
        )[0].cpu()
    torch._dynamo.reset()
    return dict(
        emulated_vs_openxla_eval=compare(y_x, y_emu),
        emulated_vs_eager=compare(y_emu, y_ref),
        openxla_eval_vs_eager=compare(y_x, y_ref),
    )


# --------------------------------------------------------------------------------------------
# 2. per-op local error
# --------------------------------------------------------------------------------------------
def _fetch(env, a):
    return pytree.tree_map_only(fx.Node, lambda n: env[n], a)


def _run_node(n, args, kwargs, owner):
    if n.op == "call_function":
        return n.target(*args, **kwargs)
    if n.op == "call_method":
        self_, *rest = args
        return getattr(self_, n.target)(*rest, **kwargs)
    if n.op == "get_attr":
        return getattr(owner, n.target)
    raise NotImplementedError(n.op)


def _label(n):
    if n.op == "call_method":
        return f".{n.target}"
    t = n.target
    return getattr(t, "__name__", str(t))


def local_op_errors(ts=500):
    """Every FX node re-run on XLA with the eager-CPU values of its inputs."""
    import torch_xla

    dev = torch_xla.device()
    m, x, enc = build()
    mx = copy.deepcopy(m).to(dev)
    t = torch.tensor([ts])
    gm, ex = capture(mx, x.to(dev), t.to(dev), enc.to(dev))
    g = graph_to_cpu(gm)
    env = {}
    rows = []
    phs = [n for n in g.graph.nodes if n.op == "placeholder"]
    for n, e in zip(phs, ex):
        env[n] = e.cpu()
    with torch.no_grad():
        for n in g.graph.nodes:
            if n.op in ("placeholder", "output"):
                continue
            args, kwargs = _fetch(env, n.args), _fetch(env, n.kwargs)
            to_x = lambda v: v.to(dev) if isinstance(v, torch.Tensor) else v  # noqa: E731
            xargs = pytree.tree_map(to_x, args)
            xkwargs = dict(pytree.tree_map(to_x, dict(kwargs)))
            if "device" in n.kwargs:
                xkwargs["device"] = dev
            if n.target is operator.setitem:
                xbuf = xargs[0].clone()
                _run_node(n, (xbuf,) + tuple(xargs[1:]), xkwargs, g)
                env[n] = _run_node(n, args, kwargs, g)  # mutates the CPU buffer in place
                ref, got = args[0], xbuf
            else:
                ref = _run_node(n, args, kwargs, g)
                env[n] = ref
                got = _run_node(n, xargs, xkwargs, g)
            if n.target in (torch.empty_like, torch.empty):
                continue  # uninitialised memory on CPU: nothing to compare
            refs = [r for r in pytree.tree_leaves(ref) if isinstance(r, torch.Tensor)]
            gots = [r for r in pytree.tree_leaves(got) if isinstance(r, torch.Tensor)]
            if not refs or not refs[0].is_floating_point():
                continue
            err = max((a.double() - b.cpu().double()).abs().max().item() for a, b in zip(refs, gots))
            scale = max(a.double().abs().max().item() for a in refs)
            rows.append(
                dict(
                    node=n.name,
                    op=_label(n),
                    module=module_path(n),
                    shape=list(refs[0].shape),
                    maxabs=err,
                    rel=err / max(scale, 1e-30),
                    ref_absmax=scale,
                )
            )
    return rows


# --------------------------------------------------------------------------------------------
# 3. accumulated-error bisection of openxla_eval
# --------------------------------------------------------------------------------------------
def openxla_eval_bisect(ts=500, thresh=1e-4, window=30):
    import torch_xla
    from torch._dynamo.backends.torchxla import openxla_eval

    dev = torch_xla.device()
    m, x, enc = build()
    mx = copy.deepcopy(m).to(dev)
    t = torch.tensor([ts])
    gm, ex = capture(mx, x.to(dev), t.to(dev), enc.to(dev))

    # eager CPU value of every node
    g_cpu = graph_to_cpu(gm)
    env = {}
    for n, e in zip([n for n in g_cpu.graph.nodes if n.op == "placeholder"], ex):
        env[n] = e.cpu()
    vals = {}
    with torch.no_grad():
        for n in g_cpu.graph.nodes:
            if n.op in ("placeholder", "output"):
                continue
            env[n] = _run_node(n, _fetch(env, n.args), _fetch(env, n.kwargs), g_cpu)
            if (
                isinstance(env[n], torch.Tensor)
                and env[n].is_floating_point()
                and n.target not in (torch.empty_like, torch.empty)
            ):
                vals[n.name] = env[n].clone()
    cands = [n.name for n in gm.graph.nodes if n.name in vals]

    cache = {}

    def err_at(name):
        if name in cache:
            return cache[name]
        g = fx.Graph()
        em = {}
        for n in gm.graph.nodes:
            if n.op == "output":
                continue
            em[n] = g.node_copy(n, lambda a: em[a])
            if n.name == name:
                c = g.call_method("clone", (em[n],))
                g.output((c,))
                break
        sub = fx.GraphModule(gm, g)
        torch._dynamo.reset()
        with torch.no_grad():
            y = openxla_eval(sub, ex)(*ex)[0].cpu()
        ref = vals[name]
        e = (y.double() - ref.double()).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        cache[name] = e
        return e

    lo, hi = 0, len(cands) - 1
    if err_at(cands[hi]) <= thresh:
        return dict(first=None, probes=cache)
    while lo < hi:  # first index whose value is off by > thresh (relative)
        mid = (lo + hi) // 2
        if err_at(cands[mid]) > thresh:
            hi = mid
        else:
            lo = mid + 1
    # the predicate is not monotone in node order (an independent branch after the first bad
    # node can still be right), so walk back from the hit to the earliest bad node near it
    k = lo
    for j in range(lo - 1, max(lo - window, 0) - 1, -1):
        if err_at(cands[j]) > thresh:
            k = j
    lo = k
    first = cands[lo]
    node = next(n for n in gm.graph.nodes if n.name == first)
    return dict(
        first=first,
        first_op=_label(node),
        first_module=module_path(node),
        first_err=cache[first],
        prev=cands[lo - 1] if lo else None,
        prev_err=err_at(cands[lo - 1]) if lo else None,
        probes=cache,
        code_line=_code_line(gm, first),
    )


def _code_line(gm, name):
    for line in gm.code.splitlines():
        if line.strip().startswith(f"{name} ="):
            return line.strip().split(";")[0][:160]
    return ""


def partitioned_order_check(ts=500):
    """Order of the graph openxla_eval actually hands to XLA (after its CPU-fallback
    partitioner), read-before-write pairs in it."""
    import torch_xla
    from torch_xla._dynamo import dynamo_bridge as db

    dev = torch_xla.device()
    m, x, enc = build()
    mx = copy.deepcopy(m).to(dev)
    t = torch.tensor([ts])
    found = {}
    orig = db.extract_internal

    def spy(fused_module):
        found.setdefault("bad", []).extend(setitem_read_before_write(fused_module))
        return orig(fused_module)

    db.extract_internal = spy
    try:
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(mx, backend="openxla_eval", fullgraph=True)(
                x.to(dev), t.to(dev), enc.to(dev), return_dict=False
            )
        gm, _ = capture(mx, x.to(dev), t.to(dev), enc.to(dev))
        found["bad_in_dynamo_graph"] = setitem_read_before_write(gm)
    finally:
        db.extract_internal = orig
        torch._dynamo.reset()
    return found


# --------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="t=500 only, skip bf16 and op table")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    res = {}
    t0 = time.time()
    ts = (500,) if args.quick else TIMESTEPS

    print("== 1. end to end: XLA (one device) vs eager CPU ==")
    rows = end_to_end(torch.float32, ts)
    if not args.quick:
        rows += end_to_end(torch.bfloat16, (500,))
    res["e2e"] = rows
    print(f"{'dtype':9s} {'path':38s} {'t':>4s} {'max-abs':>10s} {'PCC':>12s}")
    for r in rows:
        extra = ""
        if "floor_maxabs" in r:
            extra = (
                f"   vs fp32 CPU {r['maxabs_vs_fp32_cpu']:.3e}/{r['pcc_vs_fp32_cpu']:.6f};"
                f" bf16 floor (bf16 CPU vs fp32 CPU) {r['floor_maxabs']:.3e}/{r['floor_pcc']:.6f}"
            )
        print(f"{r['dtype']:9s} {r['path']:38s} {r['t']:4d} {r['maxabs']:10.3e} {r['pcc']:12.8f}{extra}")

    print("\n== 2. emulation: dynamo graph on CPU in the partitioner's node order ==")
    res["emulation"] = emulate_bug_on_cpu()
    for k, (a, p) in res["emulation"].items():
        print(f"{k:28s} max-abs {a:.3e}  PCC {p:.8f}")

    print("\n== 3. write-before-read check on setitem nodes ==")
    chk = partitioned_order_check()
    res["order_check"] = chk
    print(f"dynamo graph (original order): {len(chk['bad_in_dynamo_graph'])} read-before-write pairs")
    print(f"graph after openxla_eval's partitioner: {len(chk.get('bad', []))} read-before-write pairs")
    for s, r, ps, pr in chk.get("bad", []):
        print(f"   {r} (pos {pr}) reads the buffer that {s} (pos {ps}) writes")

    if not args.quick:
        print("\n== 4. per-op local error (each node on XLA fed the eager-CPU values of its inputs) ==")
        loc = local_op_errors()
        res["local"] = loc
        loc_sorted = sorted(loc, key=lambda r: -r["maxabs"])
        print(f"{len(loc)} float nodes; max local max-abs {loc_sorted[0]['maxabs']:.3e}")
        print(f"{'node':28s} {'op':26s} {'module':34s} {'max-abs':>10s} {'rel':>10s} {'|ref|max':>9s}")
        for r in loc_sorted[: args.top]:
            print(
                f"{r['node']:28s} {r['op'][:26]:26s} {r['module'][:34]:34s} {r['maxabs']:10.3e} "
                f"{r['rel']:10.3e} {r['ref_absmax']:9.3f}"
            )
        print("the usual suspects (worst node of each kind):")
        for op in (
            "sin",
            "cos",
            "exp",
            "gelu",
            "silu",
            "layer_norm",
            "rms_norm",
            "scaled_dot_product_attention",
            "linear",
            "conv3d",
        ):
            rs = [r for r in loc if r["op"] == op]
            if rs:
                r = max(rs, key=lambda r: r["maxabs"])
                print(
                    f"   {op:28s} {len(rs):3d} nodes, worst {r['node']:18s} max-abs {r['maxabs']:.3e}"
                    f" rel {r['rel']:.3e} (|ref|max {r['ref_absmax']:.3f})"
                )
        print("by relative error:")
        for r in sorted(loc, key=lambda r: -r["rel"])[:5]:
            print(
                f"{r['node']:28s} {r['op'][:26]:26s} {r['module'][:34]:34s} {r['maxabs']:10.3e} "
                f"{r['rel']:10.3e} {r['ref_absmax']:9.3f}"
            )

    print("\n== 5. openxla_eval accumulated-error bisection (graph truncated after node k) ==")
    b = openxla_eval_bisect()
    res["bisect"] = b
    print(
        f"first node off by > 1e-4 relative: {b['first']}  ({b.get('first_op')}, {b.get('first_module')})"
        f"  rel err {b.get('first_err', 0):.3e}; previous node {b.get('prev')} rel err {b.get('prev_err', 0) or 0:.3e}"
    )
    print(f"   {b.get('code_line')}")
    print("   probes: " + ", ".join(f"{k}={v:.1e}" for k, v in b["probes"].items()))
    print(f"\n[{time.time() - t0:.0f} s]")
    if args.json:
        from planner.files import write_text

        write_text(args.json, json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _docs import main_writing

    def fenced():  # the script prints columns, not markdown: keep them as printed
        print("```")
        main()
        print("```")

    main_writing(
        fenced if "--write" in sys.argv else main,
        "numerics-bisect.md",
        "One-device XLA vs eager CPU on the tiny Wan DiT: the bisection docs/numerics.md reads",
        context="Sections and method: the script's docstring; the write-up: docs/numerics.md.",
    )
