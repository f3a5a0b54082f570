"""Pure planning: meshes, the annotated graph, sharding states, op rules, cost model, ILP, plans.

Nothing here imports torch_xla or wancompile (DESIGN.md §3): plans are made on any laptop.
"""


def plan_graph(*args, **kwargs):
    """Plan a captured Wan DiT graph; see `planner.autoplan.plan_graph`."""
    from planner.autoplan import plan_graph as _plan_graph

    return _plan_graph(*args, **kwargs)
