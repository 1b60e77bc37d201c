"""The deletion vectors the mirror writes by hand (sinks/deletion_vectors.py): Z85 as ZeroMQ
defines it, vectors that read back exactly (one file holding several), a damaged one refused by
name, and a vector delta-rs applies as Delta readers do."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import StateError
from airflow_provider_cdc.sinks import deletion_vectors as dvs

pytestmark = pytest.mark.integration


def test_z85_is_zeromqs():
    raw = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])  # the ZeroMQ RFC 32 test vector
    assert dvs.z85_encode(raw) == "HelloWorld"
    assert dvs.z85_decode("HelloWorld") == raw
    u = bytes(range(16))
    assert dvs.z85_decode(dvs.z85_encode(u)) == u


def test_vectors_read_back_exactly_and_damage_is_refused(tmp_path):
    uri = str(tmp_path)
    rng = np.random.default_rng(7)
    vectors = [np.array([], dtype=np.uint64), np.array([0, 1, 5], dtype=np.uint64),
               np.unique(rng.integers(0, 3_000_000, 200_000)).astype(np.uint64)]
    descriptors = dvs.write_vectors(uri, vectors)
    assert len({d["pathOrInlineDv"] for d in descriptors}) == 1  # one file, three vectors at offsets
    assert descriptors[0]["offset"] == 1 and [d["cardinality"] for d in descriptors] == [0, 3, len(vectors[2])]
    for want, d in zip(vectors, descriptors, strict=True):
        assert np.array_equal(dvs.read_vector(uri, d), want)
    keep = dvs.keep_mask(uri, descriptors[1], 7)
    assert keep.tolist() == [False, False, True, True, True, False, True]
    assert dvs.keep_mask(uri, None, 7) is None

    name = dvs.dv_file_name(descriptors[1])
    data = bytearray(storage.read_bytes(storage.join(uri, name)))
    data[descriptors[1]["offset"] + 9] ^= 0xFF  # a flipped bit inside the second vector
    storage.write_bytes(storage.join(uri, name), bytes(data))
    with pytest.raises(StateError, match="damaged"):
        dvs.read_vector(uri, descriptors[1])


def test_delta_rs_applies_a_vector_the_package_wrote(tmp_path):
    """A remove + add of the same file with the vector, written as a Delta commit by the
    package's log writer, is read by delta-rs's scan with those rows gone."""
    from deltalake import DeltaTable, write_deltalake

    from airflow_provider_cdc.sinks import delta_log

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"a": list(range(10))}), configuration={"delta.enableDeletionVectors": "true"})
    dt = DeltaTable(uri)
    state = delta_log.log_state(uri, dt.version(), dt.metadata().id)
    (path, add), = state.adds.items()
    dv = dvs.write_vectors(uri, [np.array([2, 3, 9], dtype=np.uint64)])[0]
    remove = {"path": path, "deletionTimestamp": 1, "dataChange": True, "size": add["size"],
              "partitionValues": {}}
    delta_log.write_commit(uri, 1, [{"remove": remove}, {"add": {**add, "deletionVector": dv}}])
    assert sorted(pa.table(DeltaTable(uri).scan())["a"].to_pylist()) == [0, 1, 4, 5, 6, 7, 8]
    from deltalake.exceptions import CommitFailedError

    with pytest.raises(CommitFailedError):  # put-if-absent: version 1 exists
        delta_log.write_commit(uri, 1, [{"remove": remove}])
    state = delta_log.log_state(uri, 1, dt.metadata().id)
    assert state.adds[path]["deletionVector"] == dv
