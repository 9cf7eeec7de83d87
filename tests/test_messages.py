"""Numbers in sentences: "1 zombie", "2 zombies", and a value echoed as it was typed."""

import pytest

from zombie_pipeline.messages import counted, plural, shown


@pytest.mark.parametrize(
    ("count", "noun", "said"),
    [
        (1, "zombie", "1 zombie"),
        (0, "zombie", "0 zombies"),
        (2, "retry", "2 retries"),
        (1, "delayed retry", "1 delayed retry"),
        (3, "delayed retry", "3 delayed retries"),
        (2, "cache entry", "2 cache entries"),
        (5, "success", "5 successes"),
        (2, "healthy started job", "2 healthy started jobs"),
        (2, "day", "2 days"),
    ],
)
def test_a_count_agrees_with_its_noun(count, noun, said):
    assert counted(count, noun) == said


def test_words_that_follow_a_count_agree_with_it():
    assert [plural(1, "its", "their"), plural(2, "its", "their"), plural(2, "is"), plural(1, "is")] == [
        "its",
        "their",
        "are",
        "is",
    ]


def test_a_value_is_echoed_as_it_was_typed():
    assert [shown(-3.0), shown(1.5), shown(0.05), shown(7), shown("x")] == ["-3", "1.5", "0.05", "7", "'x'"]
