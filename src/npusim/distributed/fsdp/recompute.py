"""The recompute rule: a forward run again inside backward (activation checkpointing)
all-gathers nothing twice, triggers no forward prefetch, and is reduced and resharded.

See Note [Recompute inside backward] and Note [Reentrant recompute of a module run twice].
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from npusim.distributed.fsdp import fsdp_private as private
from npusim.distributed.fsdp.fsdp_private import in_backward

# Note [Recompute inside backward]
# Activation checkpointing runs a block's forward again while autograd is
# executing the backward graph. "Inside backward" is what tells a recompute
# from a real forward (``torch._C._current_graph_task_id() != -1``, the same
# test FSDP2 uses in ``is_bw``); "a forward already ran" would misfire on a
# module called twice in one forward (weight tying), several forwards before
# one backward, and eval / no_grad forwards.
# PyTorch 2.13 already keeps a recompute from resharding (``post_forward``
# skips ``reshard`` under ``is_bw()``) and from all-gathering parameters that
# the pre-backward hook already unsharded (``FSDPState._pre_forward`` returns
# early in PRE_BACKWARD). What it still does is run the module's explicit
# forward prefetch (``set_modules_to_forward_prefetch``) when the recomputed
# module's state is not PRE_BACKWARD: always under reentrant checkpointing
# (the first forward ran under no_grad, so no pre-backward hook exists) and
# for FSDP modules nested inside a checkpointed block. Those prefetches
# all-gather modules whose backward already ran (a wasted all-gather each) or
# that are far from being needed. The rule empties the module's forward
# prefetch list for the duration of a forward run inside backward and puts it
# back afterwards, through a forward pre-hook that runs before FSDP's and a
# post-hook that always runs after FSDP's. No PyTorch function is replaced.
#
# Note [Reentrant recompute of a module run twice]
# Under reentrant checkpointing the first forward runs under no_grad, so FSDP
# registers no pre- or post-backward hook for it; a recompute is the only
# forward that can. PyTorch 2.13 does that for the first recompute of a module
# (its state is IDLE) but not for a later one in the same backward (a module
# called twice, or several forwards before one backward): the state is still
# PRE_BACKWARD, so ``FSDPState._pre_forward`` only all-gathers and returns.
# That call's gradients are then never reduce-scattered (they linger in the
# unsharded parameter and leak into the next step) and its parameters stay
# unsharded after the step. When a forward runs inside backward while the
# state is PRE_BACKWARD but its parameter group already finished a
# post-backward (POST_BACKWARD: nothing of this call was reduced yet), the
# rule sets the state back to IDLE, so FSDP takes the same path as for the
# first recompute: all-gather, hooks, and reduce-scatter plus reshard in
# post-backward. Under non-reentrant checkpointing of the FSDP module itself
# the condition does not arise: each call's own pre-backward hook (registered
# by the real forward) runs before its recompute and sets the group to
# PRE_BACKWARD; with a non-reentrant checkpoint around more than the module
# (recompute before that hook) training and counts equal PyTorch's (tested).


class _RecomputeRule:
    """The hooks of one FSDP module; a stack so that a recursive call restores correctly."""

    def __init__(self, module: FSDPModule) -> None:
        self.module = module
        self.saved: list[list[Any] | None] = []
        self.suppressed = 0  # forward prefetches skipped (for tests and the benchmark)
        self.rearmed = 0  # recomputes given their own backward hooks (Note [Reentrant recompute of a module run twice])

    def pre_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not in_backward():
            self.saved.append(None)
            return
        if (private.training_state(self.module) == private.TrainingState.PRE_BACKWARD
                and private.any_group_in_post_backward(self.module)):
            private.set_training_state(self.module, private.TrainingState.IDLE)
            self.rearmed += 1
        prefetch = private.forward_prefetch_states(self.module)
        if prefetch:
            self.saved.append(prefetch)
            # The public setter validates its argument; an empty list is always valid.
            self.module.set_modules_to_forward_prefetch([])
            self.suppressed += 1
        else:
            self.saved.append(None)

    def post_forward(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self.saved:  # always_call after a pre-hook that raised
            return
        prefetch = self.saved.pop()
        if prefetch is not None:
            private.restore_forward_prefetch_states(self.module, prefetch)


def install_recompute_rule(module: FSDPModule) -> _RecomputeRule:
    """Registers the rule on ``module`` (idempotent); returns its hook holder."""
    existing = getattr(module, "_npusim_recompute_rule", None)
    if existing is not None:
        return existing
    rule = _RecomputeRule(module)
    # Registered after fully_shard's hooks: prepend puts ours before FSDP's
    # pre-hook, append after FSDP's post-hook.
    module.register_forward_pre_hook(rule.pre_forward, prepend=True, with_kwargs=True)
    module.register_forward_hook(rule.post_forward, always_call=True)
    module._npusim_recompute_rule = rule  # type: ignore[attr-defined]
    return rule
