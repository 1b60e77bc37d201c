"""Canonical values (core/schema.py) -> typed Arrow columns, without loss.

Both mirrors store typed columns, so a consumer gets numbers as numbers and timestamps as
timestamps; where a logical type has no lossless typed form, the canonical text is kept.
The Arrow type of each logical type: docs/operations.md (the type table).

The parts: ``arrays.py`` (arrays built without a Python object per value), ``decode.py``
(canonical values to typed columns), ``canonical.py`` (typed columns back to canonical values),
``images.py`` (typed images, the form staging, the engines and the sinks share).
"""

from .arrays import (  # noqa: F401
    _SMALL_GATHER,
    _bits,
    _take_ranges,
    _validity,
    binary_array,
    bitmap,
    bools_to_numpy,
    gather_slices,
    index_array,
    int64_array,
    release_memory,
    slices_array,
    spread_index,
    statistics_columns,
    string_array,
    validity_mask,
)
from .canonical import (  # noqa: F401
    RowNormaliser,
    _f32,
    _fast_normaliser,
    _float_canonical,
    _is_canonical_ts,
    _ts_text,
    arrow_canonical,
    normalise_value,
)
from .decode import (  # noqa: F401
    _SIMPLE,
    _SPECIAL_FLOATS,
    DELETED_COLUMN,
    KEY_COLUMN,
    META_COLUMNS,
    POSITION_COLUMN,
    _decode,
    _first_bad_key,
    _from_buffers,
    _json_read_type,
    _rows_to_arrays,
    _struct,
    arrow_type,
    decode_column,
    json_rows_to_arrays,
    json_rows_to_struct,
    mirror_schema,
    rows_to_struct,
    rows_to_table,
)
from .images import (  # noqa: F401
    _JSON_SCALARS,
    SCHEMA_META,
    TEXT_COLUMNS_META,
    _logicals,
    _to_struct,
    _with_text_columns,
    canonical_rows,
    column_as,
    conform_images,
    conform_parts,
    images_metadata,
    inferred_schema,
    metadata_schema,
    struct_columns,
    text_schema,
    text_to_canonical,
    type_image,
    type_images,
    unify_schemas,
)
