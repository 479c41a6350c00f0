"""flash_attn backend: FlashAttention-2 (the ``flash_attn`` package) and FlashAttention-3
(``flash_attn_interface`` or the ``fa3_fwd`` wheel), varlen entry points (:mod:`.attention`)."""
