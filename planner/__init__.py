"""Pure planning: meshes, the annotated graph, sharding states, op rules, cost model, ILP, plans.

Nothing here imports torch_xla or wancompile (DESIGN.md §3): plans are made on any laptop.
"""
