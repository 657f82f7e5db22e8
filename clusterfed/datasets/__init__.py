"""Data sources, non-IID partitioners and partition reports."""

from .partition import PARTITIONERS, client_arrays, make_partition, rotate_images
from .partition_base import ClientPartition, Partition, PartitionError
from .report import partition_table, plot_partition
from .sources import DATASETS, DataSource, DatasetNotFoundError, load_source

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "ClientPartition",
    "DataSource",
    "DatasetNotFoundError",
    "Partition",
    "PartitionError",
    "client_arrays",
    "load_source",
    "make_partition",
    "partition_table",
    "plot_partition",
    "rotate_images",
]
