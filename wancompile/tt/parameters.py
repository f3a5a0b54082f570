"""Which of a program's arguments tt-mlir may compute from once: tt-xla's ``parameter`` marks.

tt-xla marks every argument that holds a model parameter with a ``tt.mark_argument`` custom call of
argument type ``parameter``; tt-mlir then hoists what depends on parameters alone into const-eval functions,
run once and cached (``ttcore.load_cached`` in the TTNN IR): a weight's tile layout, an fp32 norm weight's
cast, a bias reshape, a packed projection's concat. An unmarked argument is an ``input``, and all of that
runs every call (measured, tiny DiT bf16, tt-xla plan on bh-2x4: 27 ``to_layout`` per block every call
unmarked, 12 marked). The export hands parameters over marked (`mark`, in the worker's Shardy conversion).

A weight the plan gathers per use (FSDP) is the exception: its all-gather reads parameters alone, so tt-mlir
hoists it too and keeps the weight whole, which undoes the memory the plan saves and the per-call gathers it
predicts (measured on 0.1.3). The compile reads that off the TTNN IR (`hoisted_collectives`) and compiles
again with those arguments unmarked (`unmark`). Runs in the worker process (jaxlib, no torch).
"""

from __future__ import annotations

import re


def _main(module):
    from jaxlib.mlir import ir

    for o in module.body.operations:
        o = o.operation
        if o.name == "func.func" and ir.StringAttr(o.attributes["sym_name"]).value == "main":
            return o
    raise SystemExit("the module has no @main")


def mark(module, names: list) -> dict:
    """Mark each argument of @main that holds parameters (`names`: per argument, the parameters it holds;
    [] for an input) as tt-xla does, with a ``tt.mark_argument`` custom call of argument type
    ``parameter``: tt-mlir then computes once what depends on parameters alone (its const-eval: a weight's
    tile layout, an fp32 norm weight's cast, a bias reshape), where an unmarked argument is an ``input``
    and all of that runs every call. A weight the plan gathers per use (FSDP) must not stay marked: its
    gather would be computed once too (`unmark`: the worker's compile takes the mark off again)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    block = _main(module).regions[0].blocks[0]
    args = list(block.arguments)
    if len(args) != len(names):
        raise SystemExit(f"@main has {len(args)} arguments, the export named {len(names)}")
    first = block.operations[0]
    for arg, held in zip(args, names):
        if not held:
            continue
        with ir.InsertionPoint(first):
            call = stablehlo.CustomCallOp(
                [arg.type],
                [arg],
                call_target_name=ir.StringAttr.get(_MARK),
                api_version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 0),
            )
        call.operation.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(
            {"ttcore.argument_type": ir.StringAttr.get("parameter"), "ttir.name": ir.StringAttr.get(held[0])}
        )
        arg.replace_all_uses_except(call.result, call.operation)
    return {"parameter_arguments": sum(1 for held in names if held)}


_MARK = "tt.mark_argument"


def marks(module) -> list:
    """@main's ``parameter`` marks (`mark`): (the custom call, the argument's index) each."""
    from jaxlib.mlir import ir

    out = []
    for o in _main(module).regions[0].blocks[0].operations:
        o = o.operation
        if o.name != "stablehlo.custom_call" or ir.StringAttr(o.attributes["call_target_name"]).value != _MARK:
            continue
        arg = o.operands[0].maybe_downcast()
        if isinstance(arg, ir.BlockArgument):
            out.append((o, arg.arg_number))
    return out


def unmark(module, indices: set) -> int:
    """Take the ``parameter`` mark off @main's arguments `indices`; how many were marked."""
    taken = 0
    for o, i in marks(module):
        if i in indices:
            o.results[0].replace_all_uses_with(o.operands[0])
            o.erase()
            taken += 1
    return taken


_COLLECTIVE = re.compile(r'"ttnn\.(?:all_gather|all_reduce|reduce_scatter|point_to_point|all_to_all)"')


def hoisted_collectives(ttnn_text: str) -> set:
    """@main's arguments whose const-eval function (computed once, ``ttcore.load_cached``) holds a collective."""
    functions, current = set(), None
    for line in ttnn_text.splitlines():
        m = re.search(r"func\.func (?:private )?@(\w+)\(", line)
        if m:
            current = m.group(1)
        elif current and _COLLECTIVE.search(line):
            functions.add(current)
    out = set()
    for m in re.finditer(r"ttcore\.load_cached\(@(\w+), \[([^\]]*)\]", ttnn_text):
        if m.group(1) in functions:
            out |= {int(a) for a in re.findall(r"%arg(\d+)", m.group(2))}
    return out
