"""The Tenstorrent path: programs in the form tt-mlir partitions, compiled by tt-mlir itself.

On Tenstorrent, XLA's GSPMD never runs: tt-xla hands the annotated, unpartitioned StableHLO to tt-mlir,
which partitions it with Shardy and lowers it to TTNN (DESIGN.md §4). This package

- `export`: writes each program a call runs (main, fold, VAE decode, CFG batch-2) as the StableHLO
  portable artifact torch_xla makes of it plus the plan's shardings, and converts it to Shardy form
  (``<program>.tt.mlir``) in the worker process;
- `worker`: the jax-side process (Shardy conversion, the module with its plan taken out, compile-only
  tt-mlir compile); `parameters`: the arguments handed over as parameters (computed from once);
  `constants`: constants read through their own replicated copy;
- `env`: where the plugin lives, its cache folder, and the message when it is missing;
- `ttnn`: reads the collectives and the DRAM per chip out of the final TTNN IR;
- `parts`: reads it by the model's parts: TTNN ops per block, attention score matrices, what the pins cost;
- `check`: ``wancompile tt-check``: compiles the programs for a system and sets TTNN's collectives
  beside the plan's prediction for the ``tt-mlir`` target (`planner.targets`); `tiny`: the same for a tiny
  model's call, run on CPU first; `fullsize`: for a full-size model's first blocks, exported without
  running; `format`: the report as text.
"""
