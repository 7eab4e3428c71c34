"""The raw formats by name (``bagpipe preprocess FORMAT``, ``bagpipe predict --format``).

A format's module is imported only when the format is used (the CSV ones load pyarrow),
so listing the formats for ``--help`` costs nothing.
"""

from __future__ import annotations

import importlib

from bagpipe.errors import ConfigError
from bagpipe.preprocess.formats import RawFormat

# name -> (module, class, one-line summary)
FORMATS: dict[str, tuple[str, str, str]] = {
    "criteo": ("bagpipe.preprocess.criteo", "CriteoFormat", "Criteo Kaggle / Terabyte text (tab-separated, no header)"),
    "avazu": ("bagpipe.preprocess.avazu", "AvazuFormat", "Avazu CTR CSV"),
    "taobao": ("bagpipe.preprocess.taobao", "TaobaoFormat", "Taobao display-ad CSV (FuxiCTR layout)"),
}


def raw_format(name: str, labelled: bool = True, header: str = "auto") -> RawFormat:
    """The format ``name`` reading lines with a label column (``labelled``) and a header
    line detected (``header="auto"``) or refused (``"no"``)."""
    if name not in FORMATS:
        raise ConfigError(f"unknown format {name!r} (choose from {', '.join(FORMATS)})")
    module, cls, _ = FORMATS[name]
    return getattr(importlib.import_module(module), cls)(labelled=labelled, header=header)
