"""bagpipe: exact lookahead-cached training of recommendation models.

Vocabulary used throughout: *table* (one per categorical feature), *row* (a global
row index: table offset + id), *slot* (a row of the trainer's cache), *batch*, *plan*,
*window* (L, the oracle's lookahead), *store* (the slow tier), *trainer*.
Shapes in docstrings: B (batch), F (features/tables), D (embedding dim), C (cache rows).
"""

__version__ = "0.1.0"


def load(directory, verify=True):
    """The model exported into ``directory`` by ``bagpipe export``, as an ``nn.Module``
    (:class:`bagpipe.export.model.ExportedModel`): ``model(dense, ids)`` gives logits,
    ``model.predict_lines(lines)`` click probabilities of raw log lines. Every file of
    the export is checked against the sums model.json records first (``verify=False``
    skips that)."""
    from bagpipe.export.model import load as _load

    return _load(directory, verify=verify)
