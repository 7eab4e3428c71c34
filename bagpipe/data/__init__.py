"""Datasets: the binary shard format, batch type, deterministic batch streams,
synthetic data and raw-log preprocessing."""

from bagpipe.data.batch import Batch
from bagpipe.data.schema import DatasetMeta, FeatureSpec, SplitMeta
from bagpipe.data.shards import Dataset, ShardWriter
from bagpipe.data.stream import BatchStream

__all__ = ["Batch", "BatchStream", "Dataset", "DatasetMeta", "FeatureSpec", "ShardWriter", "SplitMeta"]
