"""Trace once, replay: the FX graph is traced once per input signature and then replayed by hash.

What a user sees: the first call compiles, every later call with the same shapes runs the cached
program (no re-tracing, no recompiles), with the right numbers for new inputs; a graph the replay
cannot serve faithfully (it mutates an input, or draws random numbers) is traced per call instead and
says why (`ShardedProgram.not_replayed`).
"""

import pytest
import torch

from wancompile.verify import numerics

pytestmark = pytest.mark.usefixtures("spmd")


def _compile(fn, **options):
    torch._dynamo.reset()
    return torch.compile(fn, backend="wan_autoshard", options=options)


def test_hand_plan_2x4_traces_once_and_replays_new_inputs_exactly(tiny_model, tiny_inputs):
    import torch_xla.debug.metrics as met

    from wancompile.backend import last_program

    compiled = _compile(tiny_model, mesh="2x4", plan="tt-xla")
    with torch.no_grad():
        compiled(**tiny_inputs, return_dict=False)
        program = last_program()
        compiles = met.metric_data("CompileTime")[0]
        for scale in (2.0, -0.5, 3.0):
            inputs = dict(tiny_inputs, hidden_states=tiny_inputs["hidden_states"] * scale)
            out = compiled(**inputs, return_dict=False)[0]
            eager = tiny_model(**inputs, return_dict=False)[0]
            result = numerics(out, eager)
            assert result.pcc >= 0.99999 and result.max_abs <= 5e-6, (scale, result)
    assert program.traces == 1 and program.not_replayed is None
    assert [r.runs for r in program._replays.values()] == [4]
    assert met.metric_data("CompileTime")[0] == compiles  # replays compile nothing


def test_a_parameter_updated_in_place_between_replays_is_read_anew(tiny_model, tiny_inputs):
    import copy

    model = copy.deepcopy(tiny_model)
    compiled = _compile(model, mesh="2x4")
    with torch.no_grad():
        for _ in range(3):  # the third call reuses the parameters' program arguments
            compiled(**tiny_inputs, return_dict=False)
        model.proj_out.weight.mul_(-2.0)  # a new version of the same tensor
        out = compiled(**tiny_inputs, return_dict=False)[0]
        eager = model(**tiny_inputs, return_dict=False)[0]
    result = numerics(out, eager)
    assert result.pcc >= 0.99999 and result.max_abs <= 5e-6, result


def test_a_new_input_shape_is_traced_once_more(tiny_model):
    from wancompile.backend import last_program
    from wancompile.models import transformer_inputs

    compiled = torch.compile(tiny_model, backend="wan_autoshard", options={"mesh": "2x4"}, dynamic=False)
    torch._dynamo.reset()
    with torch.no_grad():
        for frames in (9, 9, 5, 5):  # 48 then 32 tokens: dynamo recompiles, each program traces once
            inputs = transformer_inputs("tiny", "tiny", frames)
            out = compiled(**inputs, return_dict=False)[0]
            assert numerics(out, tiny_model(**inputs, return_dict=False)[0]).max_abs <= 5e-6
            assert last_program().traces == 1


def test_a_graph_that_mutates_its_input_is_traced_per_call_and_says_why():
    from wancompile.backend import last_program

    def step(x, y):
        x.add_(1.0)
        return x * y

    compiled = _compile(step, mesh="2x4")
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    start = x.clone()
    for n in (1, 2):  # the caller's x advances as in eager
        out = compiled(x, y)
        assert torch.allclose(out, (start + n) * y, atol=1e-6) and torch.allclose(x, start + n)
    program = last_program()
    assert program.not_replayed == "the graph writes into one of its inputs" and program.traces == 2


def test_a_graph_that_draws_random_numbers_is_not_replayed():
    from wancompile.backend import last_program

    compiled = _compile(lambda x: x + torch.rand_like(x), mesh="2x4")
    x = torch.zeros(16, 4)
    a, b = compiled(x), compiled(x)
    assert not torch.equal(a, b)  # a replay with a frozen seed would repeat the same numbers
    assert last_program().not_replayed == "the graph draws random numbers (its seed must advance per call)"


def test_a_graph_that_reads_a_device_value_on_the_host_is_not_frozen_into_a_replay():
    from wancompile.backend import last_program

    def f(x, scale):
        return x * scale.cpu()  # lowered, a device -> host copy in mid-program

    compiled = _compile(f, mesh="2x4")
    x = torch.ones(8, 4)
    for value in (2.0, 3.0):
        assert torch.allclose(compiled(x, torch.tensor(value)), x * value)
    assert last_program().not_replayed.startswith("the graph copies values to the host mid-program (cpu)")
