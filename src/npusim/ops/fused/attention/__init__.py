"""op-plugin's attention operators on the npu (docs/FUSED_OPS.md, "Attention").

- :mod:`.fusion`: ``npu_fusion_attention`` / ``npu_fusion_attention_grad`` (training, autograd);
- :mod:`.fusion_v3`: ``npu_fusion_attention_v3`` / ``npu_fusion_attention_grad_v3`` (the same for graph
  mode: lengths, seed and offset as tensors);
- :mod:`.dropout_mask`: ``_npu_dropout_gen_mask``, the packed dropout masks the forward can take;
- :mod:`.inference`: ``npu_prompt_flash_attention``, ``npu_incre_flash_attention`` and
  ``npu_fused_infer_attention_score``; :mod:`.inference_out`: its ``.out`` overload.

The shared pieces: ``_core`` (the arithmetic), ``_masks`` (sparse modes), ``_layout``
(layouts, packed sequences), ``_dropout`` (Philox masks), ``_checks`` (argument errors).
"""

from npusim.ops.fused.attention import (  # noqa: F401  (registrations)
    dropout_mask,
    fusion,
    fusion_v3,
    inference,
    inference_out,
)
from npusim.ops.fused.attention._checks import ArgumentNotSimulatedError

__all__ = ["ArgumentNotSimulatedError"]
