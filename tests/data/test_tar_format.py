"""tricks_lib.data.tar_format: the strict tar reader refuses what tarfile and a naive reader miss."""

import io
import tarfile

import pytest

from tricks_lib.data import ShardError, TarShardDataset, index_tar_shard, write_tar_shards
from tricks_lib.data.tar_format import BLOCK


@pytest.fixture
def shard(tmp_path, byte_samples):
    return write_tar_shards(byte_samples(6, ext="bin"), tmp_path, samples_per_shard=6)[0]


def test_a_zeroed_block_inside_the_archive_is_an_error_not_a_shorter_shard(shard):
    data = bytearray(shard.read_bytes())
    third = index_tar_shard(shard).offsets[3]
    data[third : third + BLOCK] = bytes(BLOCK)  # a lost sector where sample 3's header was
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="data after the end-of-archive marker") as err:
        index_tar_shard(shard)
    assert err.value.offset > third
    # tarfile stops at the zero block and reports a shorter archive without a word
    assert len(tarfile.open(shard).getnames()) == 3 * 2


def test_two_concatenated_tars_are_an_error(shard):
    shard.write_bytes(shard.read_bytes() * 2)
    with pytest.raises(ShardError, match="two tar files"):
        index_tar_shard(shard)


def test_an_all_zero_file_is_not_an_empty_shard(tmp_path):
    zeros = tmp_path / "zeros.tar"
    zeros.write_bytes(bytes(10 * BLOCK))
    with pytest.raises(ShardError, match="no members") as err:
        TarShardDataset([zeros])
    assert err.value.offset == 0


def test_the_zero_padding_tar_writes_is_accepted(shard):
    assert len(index_tar_shard(shard)) == 6  # tarfile pads to 10240-byte records: all zeros after the marker
    assert shard.stat().st_size % 10240 == 0


def signed_checksum_tar(path, name):
    """A GNU tar with a non-ASCII name in the header and the checksum summed over signed chars."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
        info = tarfile.TarInfo(name)
        payload = b"payload"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    data = bytearray(buf.getvalue())
    header = data[:BLOCK]
    header[148:156] = b" " * 8
    signed = sum(b - 256 if b > 127 else b for b in header)
    data[148:156] = f"{signed:06o}\0 ".encode()
    path.write_bytes(bytes(data))
    return path


def test_a_signed_header_checksum_with_a_non_ascii_name_is_valid(tmp_path):
    path = signed_checksum_tar(tmp_path / "signed.tar", "caf\xe9\xe9\xe9.bin")
    with tarfile.open(path, encoding="latin-1") as tar:  # tarfile accepts signed checksums
        assert tar.getnames() == ["caf\xe9\xe9\xe9.bin"]
    assert len(index_tar_shard(path)) == 1


def test_a_corrupted_checksum_is_still_refused(tmp_path):
    path = signed_checksum_tar(tmp_path / "signed.tar", "caf\xe9.bin")
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01  # one flipped bit in the name: neither sum matches now
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="checksum"):
        index_tar_shard(path)


def test_a_pax_record_with_a_flipped_bit_names_the_shard_and_the_offset(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("sample-0." + "x" * 120)  # a long name: written as a pax record
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    data = bytearray(buffer.getvalue())
    record = data.index(b" path=")
    data[record - 1] ^= 0x04  # the record's length digit: "1xx" -> another length
    shard = tmp_path / "corrupt.tar"
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"corrupt\.tar.*corrupt pax record"):
        index_tar_shard(shard)
