"""flashmla backend: DeepSeek's FlashMLA decode kernel from the ``sgl-flash-mla`` wheel (module
``flash_mla``), dense paged MLA on SM 9.0 (:mod:`.decode`)."""
