"""`compile_pipeline`'s classifier-free guidance as one batch-2 forward: `CFGBatched` wraps a transformer
so that one denoising step's cond and uncond calls run as one forward, with the uncond prompt embeddings
captured from the pipeline call's `encode_prompt` (`_capture_negative_prompt`, `_CFGState`)."""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

log = logging.getLogger("wancompile")


class _CFGState:
    """The uncond prompt embeddings of the pipeline call in progress, shared by its transformers."""

    def __init__(self, mode: str = "on") -> None:
        self.mode = mode  # "on" or "auto" (the backend's cfg_parallel for the batch-2 graph)
        self.negative: Optional[torch.Tensor] = None
        # "auto" only: why batching was given up (no batch-2 plan fits memory); then two forwards per step
        self.unbatched: Optional[str] = None
        self.batched = 0  # batch-2 forwards run
        self.served = 0  # uncond calls answered from a batch-2 forward
        self.fallthrough = 0  # calls that ran as plain forwards


def _capture_negative_prompt(pipe, cfg: _CFGState) -> None:
    """Wrap the instance's `encode_prompt` to keep the negative embeddings it returns for this call."""
    encode = type(pipe).encode_prompt.__get__(pipe)

    def encode_prompt(*args: Any, **kwargs: Any):
        prompt_embeds, negative = encode(*args, **kwargs)
        cfg.negative = negative if kwargs.get("do_classifier_free_guidance", True) else None
        return prompt_embeds, negative

    pipe.__dict__["encode_prompt"] = encode_prompt


def _same(a: Any, b: torch.Tensor, version: int) -> bool:
    """`a` is `b` as it was when its version was `version` (the same tensor, or equal values)."""
    if not isinstance(a, torch.Tensor) or b._version != version:
        return False
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return bool(torch.equal(a, b))


class CFGBatched(torch.nn.Module):
    """A transformer that runs diffusers' cond + uncond forwards of one denoising step as one batch-2 forward.

    In ``cache_context("cond")`` a call with the pipeline's latents ``x``, timestep ``t`` and prompt
    embeddings ``c`` runs ``inner(cat[x, x], cat[t, t], cat[c, n])`` with ``n`` the uncond embeddings
    captured from this pipeline call's `encode_prompt`, returns the first half and keeps the second. The
    next call, in ``cache_context("uncond")``, gets the kept half if its inputs are that ``x``, ``t`` and
    ``n`` (the same tensors, or equal ones); any other call (other inputs, extra arguments, no cache
    context) runs as it is, on ``plain`` (the transformer compiled without ``cfg_parallel``: such a call is
    no CFG pair) or, without one, on ``inner``. Attributes the pipeline reads (``config``, ``dtype``,
    ``device``, ...) come from the wrapped transformer.
    """

    def __init__(
        self,
        inner: torch.nn.Module,
        original: torch.nn.Module,
        cfg: _CFGState,
        plain: Optional[torch.nn.Module] = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.plain = plain if plain is not None else inner
        object.__setattr__(self, "_original", original)
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "_context", None)
        object.__setattr__(self, "_pending", None)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_original"], name)

    def cache_context(self, name: str, **kwargs: Any):
        """diffusers' `CacheMixin.cache_context` of the wrapped transformer, also telling the wrapper which
        call of the guidance pair comes next."""
        from contextlib import contextmanager

        @contextmanager
        def context():
            object.__setattr__(self, "_context", name)
            try:
                with self._original.cache_context(name, **kwargs):
                    yield
            finally:
                object.__setattr__(self, "_context", None)

        return context()

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        *args: Any,
        return_dict: bool = True,
        attention_kwargs: Optional[dict] = None,
        **kwargs: Any,
    ):
        cfg, context, pending = self._cfg, self._context, self._pending
        object.__setattr__(self, "_pending", None)
        if context == "uncond" and pending is not None and not args and not kwargs:
            (x, xv), (t, tv), (n, nv), attn, half = pending
            if (
                attn is attention_kwargs
                and _same(hidden_states, x, xv)
                and _same(timestep, t, tv)
                and _same(encoder_hidden_states, n, nv)
            ):
                cfg.served += 1
                return _output(half, return_dict)
        negative = cfg.negative
        if (
            context == "cond"
            and negative is not None
            and cfg.unbatched is None
            and not args
            and not kwargs
            and negative.shape == encoder_hidden_states.shape
        ):
            n = negative.to(device=encoder_hidden_states.device, dtype=encoder_hidden_states.dtype)
            from planner.cfg import CfgSequential
            from planner.plan import MemoryBudgetError

            try:
                out = self.inner(
                    hidden_states=torch.cat([hidden_states, hidden_states]),
                    timestep=torch.cat([timestep, timestep]),
                    encoder_hidden_states=torch.cat([encoder_hidden_states, n]),
                    attention_kwargs=attention_kwargs,
                    return_dict=False,
                )[0]
            except (CfgSequential, MemoryBudgetError) as e:  # the backend's errors reach here as themselves
                if cfg.mode != "auto":
                    raise
                sequential = e if isinstance(e, CfgSequential) else None
                # "auto": two forwards per step, the cost model's choice (planner.cfg: ``sequential`` is the
                # cheapest option), or its answer for a CFG pair that does not fit
                cfg.unbatched = str(e)
                if sequential is not None:
                    log.info("compile_pipeline: %s", sequential)
                else:
                    log.warning(
                        "compile_pipeline: no batch-2 plan fits memory (%s); running cond and uncond as two "
                        "forwards per step",
                        e,
                    )
                return self.forward(
                    hidden_states,
                    timestep,
                    encoder_hidden_states,
                    return_dict=return_dict,
                    attention_kwargs=attention_kwargs,
                )
            cond, uncond = out.chunk(2)
            pending = tuple((v, v._version) for v in (hidden_states, timestep, n)) + (attention_kwargs, uncond)
            object.__setattr__(self, "_pending", pending)
            cfg.batched += 1
            return _output(cond, return_dict)
        cfg.fallthrough += 1
        return self.plain(
            hidden_states,
            timestep,
            encoder_hidden_states,
            *args,
            return_dict=return_dict,
            attention_kwargs=attention_kwargs,
            **kwargs,
        )


def _output(sample: torch.Tensor, return_dict: bool):
    if not return_dict:
        return (sample,)
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    return Transformer2DModelOutput(sample=sample)
