"""``bagpipe preprocess``: raw click logs (Criteo, Avazu, Taobao) -> binary shards.

Entry point: :func:`bagpipe.preprocess.run.run_preprocess` (format, :class:`~bagpipe.preprocess.options.Options`)
-> :class:`~bagpipe.preprocess.options.Result`; the shards are those of
:mod:`bagpipe.data.shards`. The modules, from the bytes up:

* :mod:`~bagpipe.preprocess.fastparse`: vectorised numpy parsers of many fields at once
  (decimal integers, hex categories, FNV-1a string keys), SWAR on 8-byte words.
* :mod:`~bagpipe.preprocess.formats`: what a format is (:class:`~bagpipe.preprocess.formats.RawFormat`:
  schema, exact line parser, fast block parser, the bisection between them), a file's
  :class:`~bagpipe.preprocess.formats.FieldLayout`, and the parsed :class:`~bagpipe.preprocess.formats.Row`
  / :class:`~bagpipe.preprocess.formats.Raw`.
* :mod:`~bagpipe.preprocess.criteo`, :mod:`~bagpipe.preprocess.avazu`,
  :mod:`~bagpipe.preprocess.taobao`: the three formats; the two CSV ones share
  :mod:`~bagpipe.preprocess.csv` (header detection, pyarrow block reader, labels, keys).
* :mod:`~bagpipe.preprocess.inputs`: opening files (plain or gzip), probing them, reading
  them in blocks of whole lines with exact line numbers, counting lines.
* :mod:`~bagpipe.preprocess.vocab`: keys -> ids (vocabulary of the train lines or
  hashing), saved in ``OUT/vocab`` and reused by ``--vocab-from``.
* :mod:`~bagpipe.preprocess.spill`: pass 1's parsed blocks kept on disk for pass 2.
* :mod:`~bagpipe.preprocess.options`: the run's options (checked when made) and result.
* :mod:`~bagpipe.preprocess.run`: the passes, the thread pipeline and the bad-line policy.

Reading is streaming: files are read in byte blocks cut at newline boundaries, so line
numbers are exact (1-based, a header counts as line 1). Each block is parsed by a
vectorised *fast path* that either accepts the whole block or declines; a declined block
is bisected into smaller pieces and, at the bottom, parsed line by line by the format's
exact reference parser, which names the bad lines.

Categorical values become int64 *keys* (Criteo: the hex value; CSV formats: a 63-bit
FNV-1a hash of the bytes; a missing value is the key -1) and keys become ids:

* hashing (``--max-rows-per-table M``): ``id = key % M``, a missing value -> 0 (as DLRM's
  ``max-ind-range``);
* vocabulary (``--min-count K``, the default with K = 1): keys seen at least K times in
  the train lines get ids 1.. in increasing key order; rarer and unseen keys share row 0.

The mapping is saved in ``OUT/vocab`` (``vocab.json`` plus, per feature,
``<name>.keys.npy`` and ``<name>.counts.npy``: every distinct key of the train lines,
sorted, with its count) and reused by ``--vocab-from DIR``.

Nothing here imports torch: ``bagpipe preprocess`` starts without it. The package's
``__init__`` imports nothing, so each module costs only what it imports itself.
"""
