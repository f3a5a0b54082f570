"""The backend's options: one frozen dataclass from the options dict and WANCOMPILE_* variables."""

import dataclasses

import pytest

from planner.mesh import MeshSpec
from wancompile.options import REWRITE_NAMES, Options, OptionsError


def test_mesh_string_becomes_a_named_2d_mesh():
    opts = Options.from_user({"mesh": "8x4"}, env={})
    assert opts.mesh == MeshSpec((8, 4), ("batch", "model"))


def test_mesh_tuple_and_custom_axis_names():
    opts = Options.from_user({"mesh": (2, 4), "axis_names": ("sp", "tp")}, env={})
    assert opts.mesh == MeshSpec((2, 4), ("sp", "tp"))


def test_options_are_frozen():
    opts = Options.from_user({"mesh": "2x4"}, env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.mesh = None


def test_environment_variables_are_read_and_the_dict_wins():
    env = {
        "WANCOMPILE_MESH": "1x4",
        "WANCOMPILE_VERIFY": "1",
        "WANCOMPILE_MEMORY_GB": "12",
        "WANCOMPILE_REWRITES": "qkv,rope",
    }
    opts = Options.from_user({"mesh": "2x4"}, env=env)
    assert opts.mesh.shape == (2, 4)
    assert opts.verify is True
    assert opts.memory_gb == 12.0
    assert opts.rewrites == ("qkv", "rope")


def test_plan_may_name_the_builtin_hand_plan():
    assert Options.from_user({"plan": "tt-xla"}, env={}).plan == "tt-xla"


def test_rewrites_all_and_none():
    assert Options.from_user({"rewrites": "all"}, env={}).rewrites == REWRITE_NAMES
    assert Options.from_user({"rewrites": "none"}, env={}).rewrites == ()


def test_rewrites_default_to_the_target_s_tt_mlir_runs_every_pass_and_says_why():
    """Left out (or "default"), the rewrites are the target's: on Tenstorrent the program that fits (patch_embed keeps
    conv3d out, so tt-mlir fuses attention at optimization level 1), on XLA none. A user's choice, and a saved plan's
    rewrites, win."""
    from planner.targets import TARGETS

    for given in ({}, {"rewrites": "default"}):
        opts = Options.from_user(given, env={})
        assert opts.rewrites is None
        names, why = opts.rewrites_for(TARGETS["tt-mlir"])
        assert names == REWRITE_NAMES and set(why) == set(names)
        assert "optimization_level 1" in why["patch_embed"] and why["rope"].startswith("tt-mlir's default: ")
        assert opts.rewrites_for(TARGETS["gspmd"]) == ((), {})
    assert Options.from_user({"rewrites": "none"}, env={}).rewrites_for(TARGETS["tt-mlir"]) == ((), {})
    asked, why = Options.from_user({"rewrites": "qkv"}, env={}).rewrites_for(TARGETS["tt-mlir"], saved=("rope",))
    assert asked == ("qkv",) and why == {"qkv": "asked for (the rewrites option)"}
    assert Options.from_user({}, env={}).rewrites_for(TARGETS["tt-mlir"], saved=("rope",))[0] == ("rope",)
    assert Options.from_user({}, env={"WANCOMPILE_REWRITES": "none"}).rewrites_for(TARGETS["tt-mlir"])[0] == ()


def test_unknown_option_key_is_an_error_listing_the_known_ones():
    known = r"known options: axis_names, cache_dir, cfg_parallel, dump_dir, fold_parameters"
    with pytest.raises(OptionsError, match=r"unknown wan_autoshard option 'mesh_shape'.*" + known):
        Options.from_user({"mesh_shape": "8x4"}, env={})


@pytest.mark.parametrize("bad", ["8by4", "8x", "x4", "0x4", "2x-4"])
def test_mesh_string_that_does_not_parse_names_the_format(bad):
    with pytest.raises(OptionsError, match=r"option 'mesh'.*(e\.g\. '8x4'|positive integer)"):
        Options.from_user({"mesh": bad}, env={})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"memory_gb": "lots"}, "memory_gb' must be a number"),
        ({"memory_gb": -1}, "must be positive"),
        ({"verify": "maybe"}, "'verify' must be a boolean"),
        ({"rewrites": ["qkv", "fuse_everything"]}, "unknown pass"),
        ({"plan": "/nonexistent/plan.json"}, "no file at"),
        ({"axis_names": "a,b"}, "needs a 'mesh'"),
        ({"mesh": "2x4", "axis_names": ("a", "a")}, "must be distinct"),
        ({"mesh": "2x4", "axis_names": ("a",)}, "one name per axis"),
    ],
)
def test_bad_option_values_are_named(options, message):
    with pytest.raises(OptionsError, match=message):
        Options.from_user(options, env={})
