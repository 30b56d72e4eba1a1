"""What every exercise-checker test needs: a stub a reader has not filled in, and a message check."""


def stub(*args):
    """A reader's untouched exercise cell: the checker must say "not attempted yet"."""
    raise NotImplementedError


def assert_names(result, *phrases):
    """The check failed (after an attempt) and its message contains every phrase."""
    assert not result.passed and result.attempted, result
    for phrase in phrases:
        assert phrase in result.message, result.message
