"""The suffix cache: draft from what followed the same context before, in this request or any earlier one.

Its modules, each importing only those listed before it:

- ``hashing``: the n-gram keys (a hash of the last n tokens per level) and the sorted parts they form.
- ``confidence``: a continuation's smoothed per-token confidence, and the draft length it pays for.
- ``group``: the token sequences of one source (history or corpus) and the search over their n-grams.
- ``index``: :class:`SuffixIndex`, the longest earlier occurrences of a context's suffix in every source.
- ``calibration``: what the drafter learns from accepted tokens, and carries to the next request.
- ``drafter``: :class:`SuffixDrafter`, which drafts from the index for the engine.
- ``corpus``: reading a folder's text files for the corpus.
- ``store_files``: the store's files: their paths, formats, checks and crash-safe writes.
- ``store_lock``: the advisory lock that saves (and clears) of one store take turns under.
- ``store_sync``: what a store knows the files hold for its index, and what another writer appended since.
- ``store_info``: ``localspec cache info`` and ``clear``: each store checked as a load checks it.
- ``store``: :class:`SuffixStore`, the persisted index shared by several writers.
- ``cache``: :class:`SuffixCache`, the suffix cache of one loaded target (what a pipeline holds).
"""
