"""``wancompile export PLAN --format python``: the plan as a Python module for plain torch_xla.

The module needs torch and torch_xla only (not wancompile), like the hand-written
``shard_dit_specs`` + ``apply_dit_sp_activation_sharding`` it replaces:

    import plan_tiny_2x4 as plan
    mesh = plan.make_mesh()                     # xs.Mesh(range(8), MESH_SHAPE, AXIS_NAMES)
    model = model.to(torch_xla.device())
    plan.shard_params(model, mesh)              # xs.mark_sharding per parameter in PARAM_SPECS
    plan.apply_activation_sharding(model, mesh) # hooks: see below
    out = model(**inputs); torch_xla.sync()

It holds ``MESH_SHAPE``, ``AXIS_NAMES``, ``PARAM_SPECS`` (every sharded parameter; all others are
replicated), ``ACTIVATION_CONSTRAINTS``: ``(module, op, occurrence, output, spec)`` — the plan's
`Location`s: the ``occurrence``-th ``op`` call whose innermost running module is ``module`` — and
``INPUT_CONSTRAINTS``: ``(module, op, occurrence, input, spec)``, a call that reads one input
through a constrained copy (a stream value read by two macros with different layouts).
``apply_activation_sharding`` expresses each one with plain torch_xla:

- the op's value is what its module returns (an ``nn.Linear`` such as ``proj_out`` or
  ``attn1.to_k``): a forward hook on that module marks its output (the seed's way);
- any other op (the block-stack entry ``:contiguous#0`` in the root forward, the permutes feeding
  SDPA): a ``TorchFunctionMode``, active while the model runs, counts ``op`` calls per innermost
  module (a module stack kept by forward pre/post hooks) and marks the matching call's output.
  This is the same rule capture uses to name Locations, so every constraint of a plan made for the
  unmodified diffusers model has a site; a site that is never reached raises after the forward
  (`check_constraints_applied`) instead of silently running unsharded.

The same mode runs ``F.layer_norm`` as explicit reductions (``layer_norm_decomposed``, the
backend's `wancompile.legalize`): without it GSPMD all-gathers the hidden state before every
LayerNorm under SP (``apply_activation_sharding(..., legalize_layer_norm=False)`` to compare).

Plans made with graph rewrites (QKV fusion, patch-embed as Linear, ...) name ops and parameters the
eager model does not have; they are refused, since the module applies to the model as diffusers
builds it.
"""

from __future__ import annotations

import ast
import importlib.util
from collections import defaultdict
from pathlib import Path

from planner.plan import MAIN_STACK, Plan, PlanError
from wancompile.report.model import Report

_TEMPLATE = '''"""Sharding plan for {model} on mesh {mesh} {axes}, exported from {source} by `wancompile export`.

{summary}

Apply with plain torch_xla (wancompile not needed):

    import torch_xla, torch_xla.runtime as xr
    xr.use_spmd()
    mesh = make_mesh()
    model = model.to(torch_xla.device())
    shard_params(model, mesh)
    apply_activation_sharding(model, mesh)
    out = model(**inputs); torch_xla.sync()

Partition specs name mesh axes per tensor dim (None = replicated), as xs.mark_sharding takes them.
"""

from typing import Callable, Optional, Sequence

import torch
import torch_xla.distributed.spmd as xs

MESH_SHAPE = {mesh_shape!r}
AXIS_NAMES = {axis_names!r}
NUM_BLOCKS = {num_blocks!r}

# Parameters of every block (blocks.0 ... blocks.{last_block}), by name inside the block.
BLOCK_PARAM_SPECS = {{
{block_specs}}}

# Parameters outside the blocks.
ROOT_PARAM_SPECS = {{
{root_specs}}}

# Every sharded parameter by fully qualified name; parameters not listed are replicated.
PARAM_SPECS = {{
    **ROOT_PARAM_SPECS,
    **{{f"blocks.{{i}}.{{name}}": spec for i in range(NUM_BLOCKS) for name, spec in BLOCK_PARAM_SPECS.items()}},
{extra_specs}}}

# (module, op, occurrence, output, spec): constrain output `output` of the `occurrence`-th `op`
# call made directly by `module` ("" = the root model) to `spec` (several on one call: in order).
ACTIVATION_CONSTRAINTS = [
{constraints}]

# (module, op, occurrence, input, spec): that call reads its `input`-th tensor argument through a
# copy constrained to `spec` (the value's other readers keep their layout; one copy per value and spec).
INPUT_CONSTRAINTS = [
{input_constraints}]


def make_mesh():
    """The plan's logical mesh over all devices, row-major."""
    import numpy as np

    n = int(np.prod(MESH_SHAPE))
    return xs.Mesh(np.arange(n), MESH_SHAPE, AXIS_NAMES)


def shard_params(model, mesh):
    """xs.mark_sharding on each parameter of PARAM_SPECS (the model must already be on the XLA device)."""
    named = dict(model.named_parameters())
    named.update(dict(model.named_buffers()))
    missing = [name for name in PARAM_SPECS if name not in named]
    if missing:
        raise KeyError(f"this plan names parameters the model does not have (e.g. {{missing[:3]}}); "
                       "was it made for another config?")
    for name, spec in PARAM_SPECS.items():
        xs.mark_sharding(named[name], mesh, spec)


_OPERATORS = {{
    f"__{{p}}{{op}}__": op for op in ("add", "sub", "mul", "truediv", "floordiv", "pow", "matmul") for p in ("", "r", "i")
}}


class _OpConstraints(torch.overrides.TorchFunctionMode):
    """Marks the output of the op calls ACTIVATION_CONSTRAINTS names that are not module outputs."""

    def __init__(self, mesh, sites, input_sites, stack, legalize_layer_norm):
        super().__init__()
        self.mesh, self.sites, self.input_sites, self.stack = mesh, sites, input_sites, stack
        self.legalize_layer_norm = legalize_layer_norm
        self.counts = {{}}
        self.copies = {{}}  # (id of the value, spec) -> (value, its constrained copy)
        self.applied = set()

    def _copy(self, value, spec):
        key = (id(value), spec)
        if key not in self.copies:
            copy = value.clone()
            xs.mark_sharding(copy, self.mesh, spec)
            self.copies[key] = (value, copy)  # the value is kept alive so that its id stays unique
        return self.copies[key][1]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {{}})
        name = getattr(func, "__name__", "")
        name = _OPERATORS.get(name, name)  # `a + b` is Tensor.__add__ here, operator.add in the plan
        module = self.stack[-1] if self.stack else ""
        key = (module, name)
        occurrence = None
        if key in self.sites or key in self.input_sites:
            occurrence = self.counts.get(key, 0)
            self.counts[key] = occurrence + 1
        reads = self.input_sites.get(key, {{}}).get(occurrence, ())
        if reads:
            slots = [("a", i) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            slots += [("k", k) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
            args = list(args)
            for index, spec in reads:
                where, at = slots[index]
                if where == "a":
                    args[at] = self._copy(args[at], spec)
                else:
                    kwargs[at] = self._copy(kwargs[at], spec)
                self.applied.add((module, name, occurrence, "input", index))
        if self.legalize_layer_norm and func is torch.nn.functional.layer_norm:
            out = layer_norm_decomposed(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        for output, spec in self.sites.get(key, {{}}).get(occurrence, ()):
            xs.mark_sharding(out[output] if isinstance(out, (tuple, list)) else out, self.mesh, spec)
            self.applied.add((module, name, occurrence, output))
        return out


{layer_norm_source}

def apply_activation_sharding(model, mesh, legalize_layer_norm=True):
    """Install the hooks that place ACTIVATION_CONSTRAINTS (and, by default, run LayerNorm as
    explicit reductions, as wancompile's lowering does); returns the hook handles."""
    modules = dict(model.named_modules())
    handles, sites = [], {{}}
    for module, op, occurrence, output, spec in ACTIVATION_CONSTRAINTS:
        if module not in modules:
            raise KeyError(f"constraint at {{module}}:{{op}}#{{occurrence}}: the model has no module {{module!r}}")
        if op == "linear" and isinstance(modules[module], torch.nn.Linear) and output == 0:
            handles.append(modules[module].register_forward_hook(_mark_output(mesh, spec)))
        else:
            sites.setdefault((module, op), {{}}).setdefault(occurrence, []).append((output, spec))
    input_sites = {{}}
    for module, op, occurrence, index, spec in INPUT_CONSTRAINTS:
        if module not in modules:
            raise KeyError(f"constraint at {{module}}:{{op}}#{{occurrence}}: the model has no module {{module!r}}")
        input_sites.setdefault((module, op), {{}}).setdefault(occurrence, []).append((index, spec))
    if sites or input_sites or legalize_layer_norm:
        handles += _install_op_constraints(model, modules, mesh, sites, input_sites, legalize_layer_norm)
    return handles


def _mark_output(mesh, spec):
    def hook(module, args, output):
        xs.mark_sharding(output, mesh, spec)
        return output

    return hook


def _install_op_constraints(model, modules, mesh, sites, input_sites, legalize_layer_norm):
    stack, state = [], {{}}
    names = {{id(m): name for name, m in modules.items()}}
    handles = []
    for name, m in modules.items():
        if m is model:
            continue
        handles.append(m.register_forward_pre_hook(_push(stack, names)))
        handles.append(m.register_forward_hook(_pop(stack)))

    def enter(mod, args):
        state["mode"] = _OpConstraints(mesh, sites, input_sites, stack, legalize_layer_norm)
        state["mode"].__enter__()

    def leave(mod, args, out):
        mode = state.pop("mode")
        mode.__exit__(None, None, None)
        model._wancompile_applied = mode.applied
        return out

    handles.append(model.register_forward_pre_hook(enter))
    handles.append(model.register_forward_hook(leave))
    return handles


def _push(stack, names):
    def hook(module, args):
        stack.append(names[id(module)])  # returns None: the module's inputs are unchanged

    return hook


def _pop(stack):
    def hook(module, args, output):
        stack.pop()  # returns None: the module's output is unchanged

    return hook


def check_constraints_applied(model):
    """Raise unless every non-module-output constraint was reached in the last forward."""
    want = {{(m, op, occ, out) for m, op, occ, out, _ in ACTIVATION_CONSTRAINTS
            if not (op == "linear" and isinstance(dict(model.named_modules())[m], torch.nn.Linear) and out == 0)}}
    want |= {{(m, op, occ, "input", i) for m, op, occ, i, _ in INPUT_CONSTRAINTS}}
    missing = want - getattr(model, "_wancompile_applied", set())
    if missing:
        raise RuntimeError(f"{{len(missing)}} activation constraint(s) never matched an op: {{sorted(missing)[:3]}}")
'''


def _spec_literal(spec) -> str:
    return "(" + ", ".join(repr(e) for e in spec) + ("," if len(spec) == 1 else "") + ")"


def export_python(rep: Report) -> str:
    plan: Plan = rep.plan
    made_with = [r.name for r in plan.rewrites if r.count]
    if made_with:
        raise PlanError(
            f"this plan was made with graph rewrites ({', '.join(made_with)}); its ops and parameters do not exist in the "
            "unmodified diffusers model the exported module applies to. Re-plan without rewrites to export it "
            "(`wancompile plan ... --rewrites none`: a plan for tt-mlir runs every rewrite by default)"
        )
    n = rep.num_blocks
    sharded = plan.sharded_params()
    by_inner: dict[str, dict[int, tuple]] = defaultdict(dict)
    root: dict[str, tuple] = {}
    for name, spec in sharded.items():
        block = plan.block_of(name)
        if block is not None and block[0] == MAIN_STACK:
            by_inner[block[2][1:]][block[1]] = spec
        else:
            root[name] = spec
    block_specs, extra = {}, {}
    for inner, per in by_inner.items():
        specs = set(per.values())
        if len(specs) == 1 and len(per) == n:
            block_specs[inner] = next(iter(specs))
        else:  # not shared by every block: list per block
            for i, spec in per.items():
                extra[f"blocks.{i}.{inner}"] = spec
    groups = {d.macro: d.strategy for d in rep.decisions()}

    def lines(specs: dict, indent: str = "    ") -> str:
        out, last = [], None
        for name in sorted(specs, key=_param_order):
            sub = name.split(".")[0]
            if sub != last and sub in groups:
                out.append(f"{indent}# {sub}: {groups[sub]}")
            last = sub
            out.append(f"{indent}{name!r}: {_spec_literal(specs[name])},")
        return "".join(x + "\n" for x in out)

    constraints, input_constraints = [], []
    seen = set()
    for a in plan.activations:
        index = a.output if a.input is None else a.input
        key = (a.location.module, a.location.op, a.location.occurrence, index, a.input is None, tuple(a.spec))
        if key in seen:
            continue
        seen.add(key)
        why = f"  # {a.reason}" if a.reason else ""
        (constraints if a.input is None else input_constraints).append(
            f"    ({a.location.module!r}, {a.location.op!r}, {a.location.occurrence}, {index}, {_spec_literal(a.spec)}),{why}\n"
        )
    summary = "\n".join(
        f"{k}: {v}"
        for k, v in (
            ("parallelism", rep.parallelism()),
            ("collectives per block", rep.bill().headline()),
            ("solver", plan.solver.status),
        )
    )
    return _TEMPLATE.format(
        model=plan.model,
        mesh=plan.mesh,
        axes=plan.mesh.axis_names,
        source=rep.source or "plan.json",
        summary=summary,
        mesh_shape=tuple(plan.mesh.shape),
        axis_names=tuple(plan.mesh.axis_names),
        num_blocks=n,
        last_block=max(n - 1, 0),
        block_specs=lines(block_specs),
        root_specs=lines(root),
        extra_specs=lines(extra),
        constraints="".join(constraints),
        input_constraints="".join(input_constraints),
        # the backend's own legalization, copied so the exported module needs no wancompile
        layer_norm_source=_function_source("wancompile.legalize", "layer_norm_decomposed"),
    )


def _param_order(name: str):
    return [int(p) if p.isdigit() else p for p in name.split(".")]


def _function_source(module: str, name: str) -> str:
    """The source of top-level function `name` in `module`, read from its file without importing it
    (`wancompile.legalize` imports torch; ``wancompile export`` only reads a plan)."""
    path = Path(importlib.util.find_spec(module).origin)
    text = path.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node)
    raise LookupError(f"no function {name} in {path}")
