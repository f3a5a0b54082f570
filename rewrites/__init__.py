"""FX graph passes that normalise the captured Wan graphs before planning (DESIGN.md §6).

Each pass is one file, numerically identical to what it replaces. Nothing here imports the planner.
"""
