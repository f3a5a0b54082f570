"""Constant folding of parameter-only subgraphs (wancompile/fold.py) in the lowering."""

import re

import pytest
import torch
import torch.nn.functional as F

from wancompile.verify import numerics, placeholder_args, run_with_backend

from conftest import capture

pytestmark = pytest.mark.usefixtures("spmd")


def _concats(hlo_path, shape: str) -> int:
    return sum(
        1 for line in hlo_path.read_text().splitlines() if re.search(rf"= {re.escape(shape)}\S* concatenate\(", line)
    )


def test_qkv_packing_is_folded_once_with_its_tp_sharding_and_the_same_collectives():
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs

    from wancompile.lowering import ShardedProgram
    from wancompile.models import build_transformer, transformer_inputs

    model, inputs = build_transformer("tiny"), transformer_inputs("tiny", "tiny", 9)  # own copy: the test edits weights
    _, plain = run_with_backend(model, inputs, mesh="2x4", plan="tt-xla", rewrites="none", reference=False)[1:]
    out, ref, program = run_with_backend(model, inputs, mesh="2x4", plan="tt-xla", rewrites=["qkv"])
    result = numerics(out, ref)
    assert result.pcc >= 0.99999 and result.max_abs <= 1e-4, result
    args = placeholder_args(program.graph, model, inputs)
    in_graph = ShardedProgram(program.source, program.graph, program.plan, program.mesh, fold=False)
    with torch.no_grad():
        assert torch.equal(in_graph(*args)[0], out[0])  # the same ops on the same device tensors

    split = program.fold.split
    assert sum(name.startswith("packed_weight") for name in split.folded) == 4  # 2 self- + 2 cross-attentions
    # Each TP shard holds whole heads: dim 0 over `model` exactly as an explicit ("model", None) mark.
    packed = program.fold._values[split.folded.index("packed_weight")]
    probe = torch.zeros(packed.shape, device=packed.device)
    xs.mark_sharding(probe, program.mesh, ("model", None))
    assert torch_xla._XLAC._get_xla_sharding_spec(packed) == torch_xla._XLAC._get_xla_sharding_spec(probe)
    del probe  # pending on the device: the next sync would compile it
    attn = model.blocks[0].attn1
    expect = torch.cat([p.weight.unflatten(0, (4, 16)) for p in (attn.to_q, attn.to_k, attn.to_v)], 1).flatten(0, 1)
    assert torch.equal(packed.cpu(), expect.detach())

    signature = lambda p: sorted((c.kind, c.axes, c.shape.split("{")[0]) for c in p.collectives())  # noqa: E731
    assert signature(program) == signature(plain) == signature(in_graph)
    assert program.fold_collectives() == []  # packing a TP-sharded weight per shard needs no communication
    # The packing of a head's q, k, v rows (1 × 3·16 × 64 per TP shard) moved out of the main program.
    assert _concats(in_graph.hlo_path, "f32[1,48,64]") == 2 and _concats(program.fold_hlo_path, "f32[1,48,64]") == 2
    assert _concats(program.hlo_path, "f32[1,48,64]") == 0 and _concats(program.hlo_path, "f32[1,32,64]") == 0

    # Cached with the parameters: later calls neither refold nor recompile.
    compiles = met.metric_data("CompileTime")[0]
    with torch.no_grad():
        again = program(*args)
    assert program.fold.runs == 1 and met.metric_data("CompileTime")[0] == compiles
    assert torch.equal(again[0], out[0])
    # An in-place edit (new _version) and a new tensor object both refold, with the new values.
    with torch.no_grad():
        attn.to_k.weight.mul_(0.5)
        edited = program(*placeholder_args(program.graph, model, inputs))
        assert program.fold.runs == 2
        eager = model(**inputs, return_dict=False)[0]
        assert numerics(edited[0], eager).max_abs <= 5e-6 and not torch.equal(edited[0], out[0])
        attn.to_v.weight = torch.nn.Parameter(attn.to_v.weight * 2)
        replaced = program(*placeholder_args(program.graph, model, inputs))
        assert program.fold.runs == 3
        assert numerics(replaced[0], model(**inputs, return_dict=False)[0]).max_abs <= 5e-6


class _NoParamOnly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.scale = torch.nn.Parameter(torch.randn(16))

    def forward(self, x):
        return F.gelu(self.proj(x)) * self.scale + x


def _lower(module, x, **kw):
    from planner.mesh import MeshSpec
    from planner.plan import Plan, replicated_params
    from wancompile.capture import annotate
    from wancompile.lowering import ShardedProgram, xla_mesh

    ((gm, example),) = capture(module, x)
    graph = annotate(gm, model="graph")
    spec = MeshSpec((2, 4), ("batch", "model"))
    return ShardedProgram(gm, graph, Plan("graph", spec, replicated_params(graph)), xla_mesh(spec), **kw), example


def test_folding_is_a_no_op_without_parameter_only_subgraphs():
    torch.manual_seed(0)
    module, x = _NoParamOnly().eval(), torch.randn(2, 16)
    folded, args = _lower(module, x)
    unfolded, _ = _lower(module, x, fold=False)
    assert folded.fold is None and folded.lowered.code == unfolded.lowered.code
    with torch.no_grad():
        assert numerics(folded(*args), module(x)).max_abs <= 1e-6


class _Mixed(torch.nn.Module):
    """One foldable value (w.t() * 2) among ops that read an input, randomness, or a mutated buffer."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.register_buffer("c", torch.randn(8))

    def forward(self, x):
        self.c.mul_(1.0)  # mutated: c and its views are not constants
        noisy = self.w * torch.rand_like(self.w)  # random
        return x @ (self.w.t() * 2) + x @ noisy.sum(0, keepdim=True).t() + self.c.view(1, 8) + (self.w[0] + x[0])


def test_only_deterministic_parameter_only_ops_are_folded():
    torch.manual_seed(0)
    module, x = _Mixed().eval(), torch.randn(3, 8)
    program, args = _lower(module, x)
    split = program.fold.split
    folded_ops = sorted(re.sub(r"_\d+$", "", n) for n in split.nodes)
    assert folded_ops == ["getitem", "mul", "t"], split.nodes  # w.t() * 2 and w[0]; no rand, no view of c
    with torch.no_grad():
        (out,) = program(*args)
    # The random term changes per call; the rest is exact: compare with the random term removed.
    w, c = module.w.detach(), module.c
    deterministic = x @ (w.t() * 2) + c.view(1, 8) + (w[0] + x[0])
    noise_term = out - deterministic  # = x @ (w * U).sum(0)^T with U ~ U[0, 1)
    bound = x.abs() @ w.abs().sum(0, keepdim=True).t()
    assert (noise_term.abs() <= bound + 1e-5).all()
    assert program.fold.runs == 1


class _Scaled(torch.nn.Module):
    """A parameter-only product, spelled as an operator or as a method: one XLA graph either way."""

    def __init__(self, as_method: bool):
        super().__init__()
        self.w, self.as_method = torch.nn.Parameter(torch.randn(24, 40)), as_method

    def forward(self, x):
        return x @ (self.w.mul(3) if self.as_method else self.w * 3)


def test_a_fold_program_xla_serves_from_its_cache_finds_the_hlo_compiled_first():
    torch.manual_seed(0)
    x = torch.randn(5, 24)
    first, args = _lower(_Scaled(as_method=False).eval(), x)
    second, other_args = _lower(_Scaled(as_method=True).eval(), x)
    assert first.fold.split.fold.code != second.fold.split.fold.code  # different FX code ...
    with torch.no_grad():
        first(*args)
        second(*other_args)  # ... one traced graph: XLA compiles it once and dumps nothing the second time
    assert first.fold.graph_hash == second.fold.graph_hash
    assert first.fold_hlo_path is not None and second.fold_hlo_path == first.fold_hlo_path
    assert second.fold_collectives() == []


@pytest.mark.parametrize("spec", [(("model", "batch"), None), (("batch", "model"), None), ("model", None)])
def test_a_value_pinned_out_of_mesh_order_stays_in_the_main_program_where_the_target_refuses_such_results(spec):
    """tt-mlir refuses a program result split over mesh axes out of mesh order ("Failed to parse output
    sharding ... T(1,0)"): for such a target a folded weight pinned so is computed in the main program (where
    that layout compiles, and tt-mlir const-evaluates it itself); every other layout is folded as before."""
    import torch.fx as fx

    from wancompile.constraints import constrain
    from wancompile.fold import split_parameter_subgraphs

    g = fx.Graph()
    w, x = g.placeholder("w"), g.placeholder("x")
    t = g.call_method("t", (w,))
    packed = g.call_function(torch.mul, (t, 2))
    for n in (w, t, packed):
        n.meta["example_value"] = torch.zeros(8, 8)
    g.call_function(constrain, (packed, "mesh", spec, 0))
    g.output(g.call_function(torch.matmul, (x, packed)))
    gm = fx.GraphModule(torch.nn.Module(), g)

    assert split_parameter_subgraphs(gm, ["w", None]).folded == ["mul"]  # a target that parses any result
    split = split_parameter_subgraphs(gm, ["w", None], results_in_order=("batch", "model"))
    if spec[0] == ("model", "batch"):
        assert split is None  # nor what it is computed from (w.t(), pinned by nothing): no other result
    else:
        assert split.folded == ["mul"]
