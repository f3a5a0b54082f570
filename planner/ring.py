"""Ring attention: what a self-attention with SP costs when its K/V circulate instead of being gathered.

Under SP over σ (n devices) a self-attention's queries stay token-split and every device needs every
key. The K/V-gather option (`planner.strategies`: ``SP(σ)+KV-gather``, ``head-TP(t)+SP(σ)``) all-gathers
K and V over σ before a plain SDPA; Ulysses all-to-alls heads; ring attention (tt-metal's scheme for
Wan, maxdiffusion's ring) keeps K/V token-split and runs n steps: in each, a device attends its queries
to the K/V chunk it holds (online softmax) while passing that chunk to its neighbour on σ (one
collective-permute of K and one of V), so the transfer of a step hides behind its compute, up to the
smaller of the two (`cost_model.ring_attention_seconds`).

`ring_evaluation` prices the ring counterpart of a K/V-gather option (`strategies.ring_variant`) from
that option's own evaluation, so both see the same projections, norms, RoPE and stream edges:

- the K and V all-gathers over σ at the SDPA's operands are removed;
- the SDPA's compute (``attention_s``, the op rule's roofline under that option: the same FLOPs as
  the gathered SDPA, Lq/n queries against all L keys) stays;
- the ring's transfers are added: per step one device's K chunk and V chunk (the gathers' results / n)
  to the neighbour, ``step_transfer_s`` = the two collective-permutes
  (`cost_model.collective_seconds`); its n-1 steps as 2(n-1) collective-permute events whose seconds
  are the *exposed* part, ``ring_attention_seconds(attention_s, step_transfer_s, n) - attention_s``,
  spread evenly (the hidden part costs nothing);

so the evaluation's ``seconds`` is the option's price with overlap. The step transfers are priced with
the profile's links whatever its compiler lowers as collective-permute (`HardwareProfile.unlowerable`:
tt-mlir's Shardy one is not): a ring SDPA moves its chunks itself. Not modelled: the online softmax's
rescaling work, the activation memory the ring saves (the whole K/V are never live; the estimate keeps
the gathered option's).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace as dc_replace
from typing import Mapping, Optional, Union

from planner.collective import Collective
from planner.cost_model import axis_devices, collective_seconds, ring_attention_seconds
from planner.graph import Graph
from planner.hardware import HardwareProfile
from planner.macros import Macro
from planner.mesh import MeshSpec
from planner.propagate import Evaluation, evaluate
from planner.strategies import Strategy


@dataclass(frozen=True)
class RingPrice:
    """One call of a ring attention (per device): ``steps`` = n devices on σ, ``attention_s`` the SDPA's
    compute, ``step_transfer_s`` one step's K and V chunks to the neighbour, ``gather_s`` the K/V
    all-gathers it replaces, ``seconds`` = `ring_attention_seconds` (compute plus what is not hidden)."""

    steps: int
    attention_s: float
    step_transfer_s: float
    gather_s: float
    seconds: float

    @property
    def exposed_s(self) -> float:
        """Transfer time not hidden behind compute."""
        return self.seconds - self.attention_s

    @property
    def hidden_s(self) -> float:
        """Transfer time hidden behind compute: the n-1 step transfers less the exposed part."""
        return (self.steps - 1) * self.step_transfer_s - self.exposed_s


def ring_evaluation(
    graph: Graph,
    macro: Macro,
    gather: Strategy,
    ev: Evaluation,
    mesh: MeshSpec,
    hw: HardwareProfile,
    values: Optional[Mapping[str, int]] = None,
) -> Union[tuple[Evaluation, RingPrice], str]:
    """The evaluation of the ring counterpart of K/V-gather option `gather` of `macro`, from `ev`
    (`gather`'s own evaluation, in GSPMD's or a target's terms), and its `RingPrice`; or why it has none."""
    sdpa = graph[macro.sdpa]
    sigma = tuple(gather.sigma)
    n = axis_devices(mesh, sigma)
    found: list[Collective] = []
    for x in sdpa.inputs[1:3]:
        where = str(graph[x].location)
        hits = [e for e in ev.events if e.kind == "all-gather" and e.where == where and set(e.axes) == set(sigma)]
        if len(hits) != 1:
            return f"no single K/V all-gather over {'+'.join(sigma)} at {where} to replace ({len(hits)} found)"
        found.append(hits[0])
    # the SDPA alone, reading its operands as the gather option has them (K/V whole on the tokens)
    boundary = {i: ev.layouts[i] for i in sdpa.inputs if i in ev.layouts}
    attention_s = evaluate(graph, [sdpa], mesh, hw, boundary=boundary, values=values).compute_seconds
    lowers = dc_replace(hw, unlowerable=())  # the ring SDPA moves its chunks itself
    chunks = [e.bytes // n for e in found]
    step_s = sum(collective_seconds("collective-permute", b, sigma, mesh, lowers) for b in chunks)
    seconds = ring_attention_seconds(attention_s, step_s, n)
    price = RingPrice(n, attention_s, step_s, sum(e.seconds or 0.0 for e in found), seconds)
    share = price.exposed_s / (2 * (n - 1))
    ring = [
        Collective(
            "collective-permute",
            e.axes,
            b,
            where=e.where,
            reason=f"ring attention: {'KV'[k]} chunk to the next device on {'+'.join(sigma)}, step {i} of {n - 1} "
            "(seconds: the part its step's attention compute does not hide)",
            seconds=share,
        )
        for i in range(1, n)
        for k, (e, b) in enumerate(zip(found, chunks))
    ]
    events = [e for e in ev.events if not any(e is f for f in found)] + ring
    return dc_replace(ev, events=events), price
