"""Full-T and chunked-T decoding for diffusers' `AutoencoderKLWan` (Wan 2.1 and Wan 2.2 VAEs).

    wancompile.enable_full_t(vae)              # vae.decode: all latent frames in one pass
    wancompile.enable_full_t(vae, t_chunk=4)   # frame 0, then chunks of 4 with a carried causal history
    wancompile.disable_full_t(vae)             # back to diffusers' frame-by-frame decode

Modules: `frames` (the decoder over many frames), `decode` (installing it on an instance),
`budget` (choosing the chunk size from a memory budget).
"""

from wancompile.vae.budget import DecodeMemory, choose_t_chunk, decode_memory
from wancompile.vae.decode import disable_full_t, enable_full_t, installed_t_chunk, is_full_t_enabled

__all__ = [
    "DecodeMemory",
    "choose_t_chunk",
    "decode_memory",
    "disable_full_t",
    "enable_full_t",
    "installed_t_chunk",
    "is_full_t_enabled",
]
