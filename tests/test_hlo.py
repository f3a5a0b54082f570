"""Reading collectives out of partitioned HLO text and mapping replica groups to mesh axes."""

import pytest

from planner.mesh import MeshSpec
from wancompile.hlo import group_axes, parse_collectives, parse_matmuls, parse_replica_groups

MESH = MeshSpec((2, 4), ("batch", "model"))

HLO = """
  %all-reduce.3 = f32[24,64]{1,0} all-reduce(%dot.8), channel_id=7, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add.1.clone
  %all-gather.2 = f32[1,48,1,16]{3,2,0,1} all-gather(%add_bitcast_fusion.11), channel_id=6, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={1}, use_global_device_ids=true
  %reduce-scatter = f32[1,12,64]{2,1,0} reduce-scatter(%x), channel_id=9, replica_groups=[1,8]<=[8], dimensions={1}, to_apply=%add
  %collective-permute.1 = f32[1,2,8]{2,1,0} collective-permute(%y), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  ROOT %all-to-all = (f32[2,8]{1,0}, f32[2,8]{1,0}) all-to-all(%a, %b), channel_id=4, replica_groups={{0,4},{1,5},{2,6},{3,7}}
  %not-a-collective = f32[2]{0} add(%p, %q)
"""


def test_replica_group_forms():
    assert parse_replica_groups("replica_groups={{0,1},{2,3}}") == ((0, 1), (2, 3))
    assert parse_replica_groups("replica_groups=[2,4]<=[8]") == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert parse_replica_groups("replica_groups=[4,2]<=[2,4]T(1,0)") == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_groups_map_to_the_mesh_axes_they_span():
    assert group_axes(((0, 1, 2, 3), (4, 5, 6, 7)), MESH) == ("model",)
    assert group_axes(((0, 4), (1, 5), (2, 6), (3, 7)), MESH) == ("batch",)
    assert group_axes((tuple(range(8)),), MESH) == ("batch", "model")


def test_parse_collectives_kinds_axes_and_bytes():
    got = [(c.kind, c.axes, c.bytes) for c in parse_collectives(HLO, MESH)]
    assert got == [
        ("all-reduce", ("model",), 24 * 64 * 4),
        ("all-gather", ("batch",), 48 * 16 * 4),
        ("reduce-scatter", ("batch", "model"), 12 * 64 * 4 * 8),
        ("collective-permute", ("model",), 16 * 4),
        ("all-to-all", ("batch",), 2 * 16 * 4),
    ]


def test_compiled_collectives_are_the_plans_type_and_are_counted_alike():
    from planner.collective import Collective
    from wancompile.verify import compare_collectives

    observed = parse_collectives(HLO, MESH)
    assert all(type(c) is Collective and c.count == 1 and c.seconds is None for c in observed)
    first = observed[0]
    assert (first.where, first.shape, first.groups) == ("all-reduce.3", "f32[24,64]{1,0}", ((0, 1, 2, 3), (4, 5, 6, 7)))
    assert "shape" not in first.to_json() and "groups" not in first.to_json()  # HLO extras never reach plan.json
    predicted = [
        Collective("all-reduce", ("model",), 24 * 64 * 4, count=2, where="blocks.*.ffn.net.2:linear#0"),
        Collective("all-gather", ("batch",), 48 * 16 * 4, where="blocks.*.attn1:permute#1"),
    ]
    rows = {(m.kind, m.axes): m for m in compare_collectives(predicted, observed + observed[:1])}
    ar = rows["all-reduce", ("model",)]
    assert (ar.predicted_count, ar.observed_count, ar.observed_bytes) == (2, 2, 2 * 24 * 64 * 4) and ar.bytes_ok()
    assert rows["all-gather", ("batch",)].count_ok
    a2a = rows["all-to-all", ("batch",)]
    assert (a2a.predicted_count, a2a.observed_count) == (0, 1) and not a2a.count_ok


MATMUL_HLO = """
HloModule m, entry_computation_layout={(f32[4,8]{1,0}, f32[16,8]{1,0})->f32[4,16]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%fused_dot (p.0: f32[4,8], p.1: f32[16,8]) -> f32[4,16] {
  %p.0 = f32[4,8]{1,0} parameter(0)
  %p.1 = f32[16,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,16]{1,0} dot(%p.0, %p.1), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

%unused (p.2: f32[4,8]) -> f32[4,4] {
  %p.2 = f32[4,8]{1,0} parameter(0)
  ROOT %dot.9 = f32[4,4]{1,0} dot(%p.2, %p.2), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

ENTRY %main (a: f32[4,8], b: f32[16,8]) -> f32[4,16] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[16,8]{1,0} parameter(1)
  %f.1 = f32[4,16]{1,0} fusion(%a, /*index=1*/%b), kind=kOutput, calls=%fused_dot
  %f.2 = f32[4,16]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused_dot
  %q = f32[2,3,5,8]{3,2,1,0} parameter(2)
  %k = f32[1,2,8,6]{3,2,1,0} parameter(3)
  %conv = f32[2,3,4,6]{3,2,1,0} convolution(%q, %k), window={size=1x2}, dim_labels=b01f_01io->b01f
  %bmm = f32[3,4,5]{2,1,0} dot(f32[3,4,7]{2,1,0} %x3, f32[3,7,5]{2,1,0} %y3), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %x3 = f32[3,4,7]{2,1,0} parameter(4)
  %y3 = f32[3,7,5]{2,1,0} parameter(5)
  ROOT %r = f32[4,16]{1,0} all-reduce(%f.1), replica_groups={{0,1}}, to_apply=%add
}
"""


def test_matmul_flops_count_fusions_per_call_site_and_skip_unreachable_computations():
    got = sorted((m.name, m.flops, m.count) for m in parse_matmuls(MATMUL_HLO))
    assert got == [
        ("bmm", 2 * 3 * 4 * 5 * 7, 1),  # batch dims are not contracted
        ("conv", 2 * (2 * 3 * 4 * 6) * (1 * 2 * 8), 1),  # kernel window x input features per output
        ("dot.1", 2 * 4 * 16 * 8, 2),  # one fused computation, two fusions calling it
    ]


def test_matmul_flops_refuse_a_while_loop():
    text = MATMUL_HLO.replace(
        "%r = f32[4,16]{1,0} all-reduce(%f.1)", "%r = f32[4,16]{1,0} while(%f.1), body=%fused_dot"
    )
    with pytest.raises(ValueError, match="while loop"):
        parse_matmuls(text)


# XLA CPU on larger shapes: the slicing fusion sits inside an outlined parallel computation that a
# `call` runs (to_apply=), as in the ÷16 A14B on 8x4 (bench/bench_score.py, STATE B's row-parallel sums).
NESTED_SLICE_HLO = """HloModule m

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%fused_slice (param_0: f32[16,32], param_1: u32[]) -> f32[16,8] {
  %param_0 = f32[16,32]{1,0} parameter(0)
  %param_1 = u32[] parameter(1)
  %constant = s32[] constant(0)
  %offset = s32[] convert(%param_1)
  ROOT %dynamic-slice.1 = f32[16,8]{1,0} dynamic-slice(%param_0, %constant, %offset), dynamic_slice_sizes={16,8}
}

%parallel_slice_fusion (p.0: f32[16,32], p.1: u32[]) -> f32[16,8] {
  %p.0 = f32[16,32]{1,0} parameter(0)
  %p.1 = u32[] parameter(1)
  ROOT %slice_fusion.clone = f32[16,8]{1,0} fusion(%p.0, %p.1), kind=kLoop, calls=%fused_slice
}

ENTRY %main (p0: f32[16,64], p1: f32[64,32]) -> f32[16,8] {
  %p0 = f32[16,64]{1,0} parameter(0)
  %p1 = f32[64,32]{1,0} parameter(1)
  %dot = f32[16,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %all-reduce = f32[16,32]{1,0} all-reduce(%dot), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %partition-id = u32[] partition-id()
  ROOT %call = f32[16,8]{1,0} call(%all-reduce, %partition-id), to_apply=%parallel_slice_fusion
}
"""


def test_an_all_reduce_sliced_inside_an_outlined_call_is_read_as_a_reduce_scatter():
    found = [(c.kind, c.bytes) for c in parse_collectives(NESTED_SLICE_HLO, MeshSpec((1, 4), ("batch", "model")))]
    assert found == [("reduce-scatter", 16 * 32 * 4)]


# An all-reduce whose users keep their slice inside fusions (XLA fused the slice into the next ops,
# here a projection of the sliced row, seen with one token per device on 1x4) is the reduce-scatter
# the plan predicts; a fusion that reads the whole sum without slicing it keeps it an all-reduce.
FUSED_SLICE = """
%fused_a (p0: f32[4,24], p1: u32[], w: f32[24,16]) -> f32[16] {
  %p0 = f32[4,24]{1,0} parameter(0)
  %b = f32[1,4,24]{2,1,0} bitcast(%p0)
  %c = s32[] constant(0)
  %p1 = u32[] parameter(1)
  %i = s32[] convert(%p1)
  %s = f32[1,1,24]{2,1,0} dynamic-slice(%b, %c, %i, %c), dynamic_slice_sizes={1,1,24}
  %w = f32[24,16]{1,0} parameter(2)
  ROOT %r = f32[16]{0} dot(%s, %w), lhs_contracting_dims={2}, rhs_contracting_dims={0}
}

%fused_b (q0: f32[4,24]) -> f32[24] {
  %q0 = f32[4,24]{1,0} parameter(0)
  ROOT %r = f32[24]{0} reduce(%q0, %z), dimensions={0}, to_apply=%add
}

ENTRY %main (x: f32[4,24], y: f32[4,24]) -> f32[1,1] {
  %all-reduce.1 = f32[4,24]{1,0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %f1 = f32[16]{0} fusion(%all-reduce.1, %pid, %w), kind=kLoop, calls=%fused_a
  %all-reduce.2 = f32[4,24]{1,0} all-reduce(%y), channel_id=2, replica_groups={{0,1,2,3}}, to_apply=%add
  %f2 = f32[24]{0} fusion(%all-reduce.2), kind=kLoop, calls=%fused_b
}
"""


def test_an_all_reduce_sliced_inside_the_next_fusion_reads_as_a_reduce_scatter():
    got = [(c.kind, c.bytes) for c in parse_collectives(FUSED_SLICE, MeshSpec((1, 4), ("batch", "model")))]
    assert got == [("reduce-scatter", 4 * 24 * 4), ("all-reduce", 4 * 24 * 4)]
