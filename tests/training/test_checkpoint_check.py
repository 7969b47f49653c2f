"""A corrupted or missing shard gives a ModelLoadError naming the file."""
import json
import shutil

import pytest

from spice_core.errors import ModelLoadError
from training.checkpoint_check import verify_checkpoint


@pytest.fixture()
def copy_dir(shipped_dir, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(shipped_dir, dst)
    return dst


def test_the_shipped_checkpoint_passes(shipped_dir):
    verify_checkpoint(shipped_dir)


def test_missing_shard_is_named(copy_dir):
    (copy_dir / "model-00003-of-00005.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model-00003-of-00005.safetensors is missing"):
        verify_checkpoint(copy_dir)


def test_truncated_shard_is_named(copy_dir):
    shard = copy_dir / "model-00002-of-00005.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(ModelLoadError, match="model-00002-of-00005.safetensors is truncated or corrupted"):
        verify_checkpoint(copy_dir)


def test_garbage_shard_is_named(copy_dir):
    (copy_dir / "model-00001-of-00005.safetensors").write_bytes(b"not a safetensors file at all" * 10)
    with pytest.raises(ModelLoadError, match="model-00001-of-00005.safetensors is corrupted"):
        verify_checkpoint(copy_dir)


def test_flipped_byte_is_caught_by_the_checksums(copy_dir):
    shard = copy_dir / "model-00004-of-00005.safetensors"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="model-00004-of-00005.safetensors .*SHA-256"):
        verify_checkpoint(copy_dir)


def test_without_checksums_a_flipped_byte_in_the_data_still_loads_the_headers(copy_dir):
    (copy_dir / "checksums.sha256").unlink()
    verify_checkpoint(copy_dir)


def test_missing_config_and_missing_directory_are_named(copy_dir, tmp_path):
    (copy_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        verify_checkpoint(copy_dir)
    with pytest.raises(ModelLoadError, match="does not exist"):
        verify_checkpoint(tmp_path / "nowhere")


def test_broken_index_is_named(copy_dir):
    (copy_dir / "model.safetensors.index.json").write_text("{")
    with pytest.raises(ModelLoadError, match="model.safetensors.index.json is not a valid"):
        verify_checkpoint(copy_dir)
    json.loads((copy_dir / "config.json").read_text())
