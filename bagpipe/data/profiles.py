"""The shapes of the synthetic data set families (``bagpipe synth --profile``): table
cardinalities as measured on the real logs, dense features, click rate, bag sizes."""

from __future__ import annotations

from dataclasses import dataclass

from bagpipe.errors import ConfigError


@dataclass(frozen=True)
class Profile:
    """The shape of one dataset family."""

    description: str
    dense_names: tuple[str, ...]
    table_names: tuple[str, ...]
    cardinalities: tuple[int, ...]
    ctr: float  # click rate the hidden model is calibrated to
    clock_dense: bool = False  # dense = (hour_of_day, day_of_week) of a 10-day clock
    bag_sizes: tuple[int, ...] = ()  # ids per sample of each table (multi-hot when > 1); () = all one-hot


_CRITEO_KAGGLE = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip

_AVAZU = {
    "C1": 7,
    "banner_pos": 7,
    "site_id": 4737,
    "site_domain": 7745,
    "site_category": 26,
    "app_id": 8552,
    "app_domain": 559,
    "app_category": 36,
    "device_id": 2686408,
    "device_ip": 6729486,
    "device_model": 8251,
    "device_type": 5,
    "device_conn_type": 4,
    "C14": 2626,
    "C15": 8,
    "C16": 9,
    "C17": 435,
    "C18": 4,
    "C19": 68,
    "C20": 172,
    "C21": 60,
}

_TINY = (10, 50, 200, 1000, 5000, 20000, 100, 3)

# MLPerf Training DLRM-DCNv2 (Criteo 1TB click logs, every table capped at 40M rows) and
# the bag sizes of its synthetic multi-hot dataset (torchrec_dlrm's multi_hot_sizes).
_CRITEO_1TB = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
_CRITEO_1TB_BAGS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)

PROFILES: dict[str, Profile] = {
    "tiny": Profile(
        description="13 dense, 8 tables of 3..20k rows (26k rows in all); for tests and demos",
        dense_names=tuple(f"I{i}" for i in range(1, 14)),
        table_names=tuple(f"C{i}" for i in range(1, len(_TINY) + 1)),
        cardinalities=_TINY,
        ctr=0.25,
    ),
    "criteo-kaggle": Profile(
        description="13 dense, the 26 DLRM Criteo Kaggle tables (33.8M rows; largest 10.1M)",
        dense_names=tuple(f"I{i}" for i in range(1, 14)),
        table_names=tuple(f"C{i}" for i in range(1, 27)),
        cardinalities=_CRITEO_KAGGLE,
        ctr=0.25,
    ),
    "criteo-1tb": Profile(
        description=(
            f"13 dense, the 26 MLPerf DLRM-DCNv2 Criteo 1TB tables capped at 40M rows "
            f"({sum(_CRITEO_1TB) / 1e6:.1f}M rows), multi-hot: {sum(_CRITEO_1TB_BAGS)} ids per sample"
        ),
        dense_names=tuple(f"I{i}" for i in range(1, 14)),
        table_names=tuple(f"C{i}" for i in range(1, 27)),
        cardinalities=_CRITEO_1TB,
        ctr=0.25,
        bag_sizes=_CRITEO_1TB_BAGS,
    ),
    "avazu": Profile(
        description="2 dense (hour of day, day of week), 21 Avazu-like tables (9.5M rows)",
        dense_names=("hour_of_day", "day_of_week"),
        table_names=tuple(_AVAZU),
        cardinalities=tuple(_AVAZU.values()),
        ctr=0.2,
        clock_dense=True,
    ),
}

#: profile name -> one-line description (for help texts).
PROFILE_DESCRIPTIONS: dict[str, str] = {name: p.description for name, p in PROFILES.items()}


def profile_tables(profile: str, scale: float = 1.0) -> list[int]:
    """Table cardinalities of ``profile`` times ``scale`` (rounded, >= 1 row each)."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r} (choose from: {', '.join(PROFILES)})")
    if not scale > 0:
        raise ConfigError(f"scale must be > 0, got {scale!r}")
    return [max(1, int(round(n * scale))) for n in PROFILES[profile].cardinalities]
