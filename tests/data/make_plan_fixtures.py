"""Fixtures: plan.json files written by the code at 46cfc16 (before the record mapping)."""
import gzip, shutil, sys
from planner.autoplan import plan_graph
from planner.cfg import plan_dit
from planner.mesh import parse_mesh
from planner.plan import save_plan
from wancompile.capture import capture_module
from wancompile.models import build_transformer, transformer_inputs

out = sys.argv[1]
m = build_transformer("tiny")
g = capture_module(m, **transformer_inputs("tiny", "tiny", 9), return_dict=False, model="tiny")[0]
save_plan(plan_graph(g, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00025), f"{out}/plan_tiny_2x4.json")
pg = capture_module(m, **transformer_inputs("tiny", "tiny", 9, batch=2), return_dict=False, model="wan-dit")[0]
save_plan(plan_dit(pg, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035, cfg_parallel="on"), f"{out}/plan_tiny_cfg_2x4.json")
