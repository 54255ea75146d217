import pickle

import pytest

from tokenloom.formats import errors
from tokenloom.formats.errors import DataError, IndexCorruptError

ALL = [getattr(errors, name) for name in errors.__all__]


def test_every_error_is_a_data_error_and_a_value_error() -> None:
    assert len(ALL) == 21
    for cls in ALL:
        assert issubclass(cls, DataError)
        assert issubclass(cls, ValueError)


def test_message_names_where_what_and_what_to_do() -> None:
    err = IndexCorruptError(
        "offsets decrease (120 then 80), expected non-decreasing offsets",
        path="data/shard_00000.idx",
        offset=64,
        record=7,
        field="offsets",
    )
    text = str(err)
    assert "offsets decrease (120 then 80)" in text
    assert "file data/shard_00000.idx" in text
    assert "offset 64" in text
    assert "record 7" in text
    assert "field 'offsets'" in text
    assert "tokenloom tokenize" in text  # the default hint says what to do
    assert (err.path, err.offset, err.record, err.field) == ("data/shard_00000.idx", 64, 7, "offsets")


def test_explicit_hint_replaces_the_default() -> None:
    err = errors.ConfigError("seq_len is 0, expected >= 1", field="seq_len", hint="Pass seq_len >= 1")
    assert str(err) == "seq_len is 0, expected >= 1 [field 'seq_len']. Pass seq_len >= 1"


@pytest.mark.parametrize("cls", ALL)
def test_errors_survive_pickling_across_processes(cls: type[DataError]) -> None:
    err = cls("bad thing", path="p", offset=1, record=2, field="f", hint="h")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err)
    assert (back.path, back.offset, back.record, back.field) == ("p", 1, 2, "f")
