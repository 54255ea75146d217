import pytest

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler import ResumableDistributedSampler


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((10, 0, 0), {}, "num_replicas is 0, expected an integer >= 1"),
        ((10, 2, 2), {}, "rank is 2, expected an integer \\[0, 1\\]"),
        ((10, 2, -1), {}, "rank is -1, expected an integer \\[0, 1\\]"),
        ((-5,), {}, "dataset_or_length is -5, expected an integer \\[0, "),
        ((10,), {"start_epoch": -1}, "start_epoch is -1, expected an integer >= 0"),
        ((10,), {"start_iter": -2}, "start_iter is -2, expected an integer \\[0, 10\\]"),
        ((10, 3, 0), {"start_iter": 5}, "start_iter is 5, expected an integer \\[0, 4\\]"),
        ((10,), {"order": "random"}, "order is 'random', expected one of 'feistel', 'torch'"),
        ((10,), {"seed": 2**64}, "seed is 18446744073709551616"),
        ((10,), {"seed": 1.5}, "seed is 1.5 \\(float\\)"),
        ((10, True, 0), {}, "num_replicas is True"),
        ((10,), {"drop_last": True, "pad": False}, "drop_last=True with pad=False"),
        (("abc",), {}, "dataset_or_length is str"),
    ],
)
def test_bad_input_is_a_config_error_naming_the_value_and_the_range(args, kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ResumableDistributedSampler(*args, **kwargs)


def test_bad_epoch_and_chunk_size_are_config_errors() -> None:
    sampler = ResumableDistributedSampler(10)
    with pytest.raises(ConfigError, match="epoch is -3"):
        sampler.set_epoch(-3)
    with pytest.raises(ConfigError, match="chunk_size is 0"):
        sampler.iter_chunks(0)


def test_a_dataset_gives_its_length() -> None:
    assert len(ResumableDistributedSampler(list(range(7)), 1, 0)) == 7
