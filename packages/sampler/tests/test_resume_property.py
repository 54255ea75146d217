"""Any schedule of resumes on any world sizes yields one epoch exactly once, in one global order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.sampler import ResumableDistributedSampler

TAILS = {"pad": {}, "drop": {"drop_last": True}, "exact": {"pad": False}}


def run_schedule(n: int, seed: int, epoch: int, tail: str, schedule: list[tuple[int, int]]):
    """Run segments of (world size, steps); the last runs to the end. Returns the round-robin
    interleave (global-position order) and the padding and drop reported by the segment that
    reached the end of the epoch."""
    kwargs = {"seed": seed, "start_epoch": epoch, **TAILS[tail]}
    merged: list[int] = []
    state = None
    end_report = None
    for number, (world, steps) in enumerate(schedule):
        samplers = [ResumableDistributedSampler(n, world, r, **kwargs) for r in range(world)]
        if state is not None:
            for sampler in samplers:
                sampler.load_state_dict(state)
        last = number == len(schedule) - 1
        report = (samplers[0].num_padded, samplers[0].num_dropped)
        # lock-step: ranks take steps together; before the end every rank has that many
        steps = max(len(s) for s in samplers) if last else min(steps, *(len(s) for s in samplers))
        iterators = [iter(s) for s in samplers]
        for _ in range(steps):
            for it in iterators:
                value = next(it, None)
                if value is not None:
                    merged.append(value)
        if last:
            assert all(next(it, None) is None for it in iterators)
        states = [s.state_dict() for s in samplers]
        assert all(other == states[0] for other in states)  # any rank's state is the state
        state = states[0]
        if end_report is None and (last or state["consumed"] == n):
            end_report = report
    assert state is not None and end_report is not None
    assert (state["epoch"], state["consumed"]) == (epoch + 1, 0)  # a finished epoch moves on
    return merged, *end_report


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 150),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 5),
    tail=st.sampled_from(sorted(TAILS)),
    schedule=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 40)), min_size=1, max_size=5),
)
def test_resumes_on_any_world_sizes_continue_one_global_order(n, seed, epoch, tail, schedule) -> None:
    single = list(ResumableDistributedSampler(n, 1, 0, seed=seed, start_epoch=epoch))
    assert sorted(single) == list(range(n))
    merged, padded, dropped = run_schedule(n, seed, epoch, tail, schedule)
    if tail == "pad":
        assert merged[:n] == single  # every index exactly once, in the single-rank order
        assert len(merged) - n == padded  # then the reported padding: repeats of the epoch start
        assert merged[n:] == [single[i % n] for i in range(padded)]
    elif tail == "drop":
        assert merged == single[: n - dropped]  # only the reported tail is missing
    else:
        assert merged == single


def test_the_example_of_the_issue_one_two_four_three() -> None:
    n = 103
    merged, padded, _ = run_schedule(n, 7, 0, "pad", [(1, 5), (2, 9), (4, 6), (3, 0)])
    single = list(ResumableDistributedSampler(n, 1, 0, seed=7))
    assert merged[:n] == single
    assert sorted(merged[:n]) == list(range(n))
    assert padded == len(merged) - n == 1  # 103 - 5 - 18 - 24 = 56 left on 3 ranks: one pad
