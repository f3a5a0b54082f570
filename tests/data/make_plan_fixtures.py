"""How tests/data's plan.json fixtures were written (by the code at 46cfc16, before planner/records.py):
``PYTHONPATH=$PWD python tests/data/make_plan_fixtures.py tests/data``; the A14B dump is
``wancompile plan --model wan2.2-t2v-a14b --component transformer --mesh 8x4 --hardware wh-galaxy
--resolution 720p --frames 81 --out DIR`` gzipped. Kept as written: they are old files that must load."""

import sys

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
cfg = plan_dit(pg, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035, cfg_parallel="on")
save_plan(cfg, f"{out}/plan_tiny_cfg_2x4.json")
