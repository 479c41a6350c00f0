"""flashmla backend: DeepSeek's FlashMLA decode kernel from the ``sgl-flash-mla`` wheel (module
``flash_mla``) on SM 9.0: its dense paged decode (:mod:`.decode`) and its sparse kernel as a paged
MLA of any page size (:mod:`.sparse`)."""


def legacy_ops():
    """The ``sgl-flash-mla`` wheel's legacy op namespace (``dense_decode_fwd``,
    ``sparse_prefill_fwd``), imported on first use."""
    from flash_mla.flash_mla_interface import get_ops

    return get_ops(True)
