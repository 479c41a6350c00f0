"""The attention family's machinery (the public names live in :mod:`flashinfer.decode`,
:mod:`flashinfer.prefill` and :mod:`flashinfer.page`).

* ``params``, ``batch_params``, ``page_rules``: kernel contracts (what every backend's kernels
  receive, the index rules as torch ops); backends import these and nothing else from here.
* ``checks``: the argument checks of the single-request entry points; ``single``: those entry
  points; ``page``: the paged-KV utilities.
* ``batch_checks`` (index arrays, dtypes, buffers), ``upload`` (one host-to-device copy of a
  plan's arrays), ``batch_wrapper`` (the wrappers' shared plan()/run()), ``batch_decode``,
  ``batch_prefill``: the batch wrappers.
"""

