"""Data loading helpers: a seeded offline image dataset, tar shards with an exactly-once
``IterableDataset``, one-file containers, a device prefetcher and page-cache control.

Modules: ``images`` (generator, encode/decode, folder writer), ``shards`` (tar shards and the
dataset over them), ``shard_index`` (a shard's index, and reading samples by it),
``shard_index_file`` (the checked index file kept beside a shard), ``tar_format`` (the strict tar
reader under the shards), ``image_folder`` (your own images in the ImageFolder layout, converted to
shards), ``samples`` (the sample check every writer runs), ``containers`` (what the one-file
containers share; a folder of files, .pt, .npy), ``lmdb_container``, ``hdf5_container`` and
``tfrecord_container`` (one checked container each), ``jpeg_batches`` (JPEG batches decoded in a
DataLoader worker into preallocated shared memory), ``jpeg_pipeline`` (JpegLoader: those batches
through a reused ring), ``loader_efficiency`` (a loader's samples/s against every core decoding as
fast as one), ``prefetch`` (DevicePrefetcher), ``cache`` (page-cache eviction and residency; a
process's and a DataLoader worker's private memory). All writers are atomic: temporary name, rename
on success.
"""

from tricks_lib.data.cache import (
    CacheResidency,
    EvictionReport,
    ProcessMemory,
    drop_from_page_cache,
    evict_from_page_cache,
    loader_worker_memory,
    page_cache_residency,
    process_memory,
)
from tricks_lib.data.containers import FolderDataset, PtDataset, write_npy, write_pt
from tricks_lib.data.hdf5_container import Hdf5Dataset, write_hdf5
from tricks_lib.data.image_folder import (
    image_folder_classes,
    image_folder_files,
    image_folder_to_shards,
    read_shard_classes,
)
from tricks_lib.data.images import (
    IMAGE_FORMATS,
    DecodeSample,
    PhotoSet,
    decode_image,
    encode_image,
    find_source_photos,
    make_samples,
    render_photos,
    write_image_folder,
)
from tricks_lib.data.jpeg_batches import (
    JPEG_DECODERS,
    BatchRequest,
    JpegBatchDataset,
    limit_worker_threads,
    prefault_pages,
)
from tricks_lib.data.jpeg_pipeline import JpegLoader, LoaderCounts
from tricks_lib.data.lmdb_container import LmdbDataset, write_lmdb
from tricks_lib.data.loader_efficiency import PipelineEfficiency, pipeline_efficiency
from tricks_lib.data.prefetch import DevicePrefetcher, move_to_device
from tricks_lib.data.samples import check_samples
from tricks_lib.data.shard_index import ShardIndex, index_tar_shard, read_tar_samples
from tricks_lib.data.shards import TarShardDataset, find_shards, write_tar_shards
from tricks_lib.data.tar_format import ShardError
from tricks_lib.data.tfrecord_container import read_tfrecord, write_tfrecord

__all__ = [
    "BatchRequest",
    "CacheResidency",
    "DecodeSample",
    "DevicePrefetcher",
    "EvictionReport",
    "FolderDataset",
    "Hdf5Dataset",
    "IMAGE_FORMATS",
    "JPEG_DECODERS",
    "JpegBatchDataset",
    "JpegLoader",
    "LmdbDataset",
    "LoaderCounts",
    "PhotoSet",
    "PipelineEfficiency",
    "ProcessMemory",
    "PtDataset",
    "ShardError",
    "ShardIndex",
    "TarShardDataset",
    "check_samples",
    "decode_image",
    "drop_from_page_cache",
    "encode_image",
    "evict_from_page_cache",
    "find_shards",
    "find_source_photos",
    "image_folder_classes",
    "image_folder_files",
    "image_folder_to_shards",
    "index_tar_shard",
    "limit_worker_threads",
    "loader_worker_memory",
    "make_samples",
    "move_to_device",
    "page_cache_residency",
    "pipeline_efficiency",
    "prefault_pages",
    "process_memory",
    "read_shard_classes",
    "read_tar_samples",
    "read_tfrecord",
    "render_photos",
    "write_hdf5",
    "write_image_folder",
    "write_lmdb",
    "write_npy",
    "write_pt",
    "write_tar_shards",
    "write_tfrecord",
]
