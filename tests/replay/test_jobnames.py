"""Job names people can type: full id, short name, unique prefix; ambiguity and typos list candidates."""

from __future__ import annotations

import pytest

from muster.replay.jobnames import NameProblem, display_names, resolve, short_name

IDS = [
    "team-a/job/train-1a2b3c4d",
    "team-a/job/train-9f8e7d6c",
    "team-b/pytorchjob/bert-0011aa22",
    "team-a-g0024",
    "team-a-g0025",
]


@pytest.mark.parametrize(
    ("typed", "job", "how"),
    [
        pytest.param("team-a-g0024", "team-a-g0024", "id", id="full-id"),
        pytest.param("bert", "team-b/pytorchjob/bert-0011aa22", "short name", id="short-name"),
        pytest.param("bert-0011aa22", "team-b/pytorchjob/bert-0011aa22", "short name", id="last-segment"),
        pytest.param("train-9f", "team-a/job/train-9f8e7d6c", "prefix", id="prefix-of-last-segment"),
        pytest.param("team-b/", "team-b/pytorchjob/bert-0011aa22", "prefix", id="prefix-of-id"),
        pytest.param("team-a-g0025", "team-a-g0025", "id", id="sim-id"),
    ],
)
def test_a_job_is_found_by_id_short_name_or_unique_prefix(typed: str, job: str, how: str) -> None:
    """What a user types resolves to one job, and the answer says how it was matched."""
    found = resolve(typed, IDS)
    assert (found.job, found.how) == (job, how)
    assert (found.note is None) == (how == "id")
    if found.note:
        assert job in found.note and typed in found.note


def test_an_ambiguous_name_lists_the_candidates() -> None:
    """`train` names two jobs (an owner recreated under the same name): both are listed, none is chosen."""
    with pytest.raises(NameProblem) as problem:
        resolve("train", IDS)
    assert "ambiguous" in str(problem.value)
    assert "team-a/job/train-1a2b3c4d" in str(problem.value) and "team-a/job/train-9f8e7d6c" in str(problem.value)


def test_a_live_job_is_preferred_when_the_caller_asks() -> None:
    """Of two jobs with one short name, the only live one is chosen for a command on live jobs."""
    found = resolve("train", IDS, preferred=lambda j: j.endswith("9f8e7d6c"))
    assert found.job == "team-a/job/train-9f8e7d6c"


def test_a_typo_names_the_closest_jobs() -> None:
    """A name no job answers to is refused with the closest ids."""
    with pytest.raises(NameProblem) as problem:
        resolve("team-a-g0042", IDS)
    assert "no job 'team-a-g0042'" in str(problem.value) and "team-a-g0024" in str(problem.value)


def test_tables_show_the_short_name_only_where_it_names_one_job() -> None:
    """The display name is the short name when unique, else the full id: typed back, it finds the same job."""
    names = display_names(IDS, IDS)
    assert names["team-b/pytorchjob/bert-0011aa22"] == "bert"
    assert names["team-a/job/train-1a2b3c4d"] == "team-a/job/train-1a2b3c4d"
    assert short_name("team-a-g0024") == "team-a-g0024"
    for job, shown in names.items():
        assert resolve(shown, IDS).job == job
