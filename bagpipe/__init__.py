"""bagpipe: exact lookahead-cached training of recommendation models.

Vocabulary used throughout: *table* (one per categorical feature), *row* (a global
row index: table offset + id), *slot* (a row of the trainer's cache), *batch*, *plan*,
*window* (L, the oracle's lookahead), *store* (the slow tier), *trainer*.
Shapes in docstrings: B (batch), F (features/tables), D (embedding dim), C (cache rows).
"""

__version__ = "0.1.0"
