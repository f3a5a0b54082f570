"""wancompile: a torch.compile backend that auto-shards Wan 2.2 over XLA device meshes.

    transformer = torch.compile(pipe.transformer, backend="wan_autoshard", options={"mesh": "8x4"})
"""

__version__ = "0.1.0"

from wancompile.vae import disable_full_t, enable_full_t

__all__ = ["enable_full_t", "disable_full_t", "__version__"]
