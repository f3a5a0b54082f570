"""`DitState`: the state every part of `planner.dit_family.DitFamily` reads, declared in one place.

`DitFamily.__init__` sets each attribute once, from the graph and its `planner.request.PlanRequest`; nothing
changes them afterwards. The parts (`dit_pricing`, `dit_problem`, `dit_advice`, `dit_explain`, `dit_assemble`,
`dit_pins`) derive from this class, so what they share is this list and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

if TYPE_CHECKING:
    from planner.graph import Graph
    from planner.hardware import HardwareProfile
    from planner.macros import Macro
    from planner.mesh import MeshSpec
    from planner.padding import PadHeads
    from planner.request import PlanRequest
    from planner.structure import Structure
    from planner.targets import Target


class DitState:
    request: "PlanRequest"  # as built (blocks, batch axes, model filled in): `_with` derives variants from it
    g: "Graph"  # the DiT graph as planned (`structure.dit_graph`)
    mesh: "MeshSpec"
    hw: "HardwareProfile"  # priced for the request's target
    st: "Structure"  # `structure.find_structure(g)`
    n: int  # blocks of the whole model
    copies: int  # weight sets resident per device
    vals: dict[str, int]  # example sizes of symbolic dims
    sequence_parallel: bool
    only: dict[str, str]
    preset: str
    model: str
    stream_layouts: bool
    batch_axes: tuple[str, ...]  # the request's batch axes of size > 1
    inputs: dict  # the batch-split model inputs' layouts
    batch_nodes: set  # the batch-carrying values
    base: dict  # the layouts every option starts from
    macro_of: dict[str, str]  # node -> its macro
    macros: list["Macro"]  # block, family and root macros
    family_first: dict  # first macro of each block family -> the family
    hidden: Optional[int]  # hidden size where split stream layouts are offered, else None
    spec: "Target"  # the request's target
    target: Optional["Target"]  # None where the op rules model the target's reshards (GSPMD), else `spec`
    pad_heads: Optional["PadHeads"]
    fsdp_blocks: dict[str, int]
    pads: Mapping[str, Any]  # macro -> its head padding (`padding.pad_targets`)
    _ends: dict  # (stream key, priced) -> `ends(key)`
    _variants: dict  # macro -> (family on its padded graph, its macro there) or why not
    _rings: dict  # macro -> its ring options as priced
