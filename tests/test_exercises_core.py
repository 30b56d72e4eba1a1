"""The checker framework: never raises, says 'not attempted yet' for stubs, names the reader's line."""

import pytest
import torch

from attnlib.exercises._core import CandidateError, CheckResult, as_tensor, checker, expect_close, run


@checker("double it")
def check_double(candidate) -> str:
    x = torch.arange(4.0)
    got = as_tensor(run(candidate, x), "your result", shape=(4,))
    expect_close(got, 2 * x, "your result", mistakes={"you added 2 instead of doubling": x + 2})
    return "doubles every entry"


def test_correct_candidate_passes():
    result = check_double(lambda x: x * 2)
    assert result.passed and bool(result) and result.status == "passed"
    assert "passed" in repr(result) and "passed" in result._repr_html_()


def test_stub_reads_not_attempted():
    def stub(x):
        raise NotImplementedError
    result = check_double(stub)
    assert not result.passed and not result.attempted
    assert result.status == "not attempted yet" and "not attempted yet" in result.message


def test_known_mistake_is_named():
    result = check_double(lambda x: x + 2)
    assert not result.passed and "you added 2 instead of doubling" in result.message


def test_a_known_mistake_with_an_off_by_one_on_top_is_named_as_both():
    result = check_double(lambda x: x + 3)
    assert "it matches you added 2 instead of doubling, and +1 on top of that (an off-by-one)" in result.message, \
        result.message


def test_an_unknown_mistake_is_described_by_its_structure():
    result = check_double(lambda x: x * 3)
    assert "it is the expected result times 1.5" in result.message, result.message


def test_an_unknown_mistake_without_structure_gives_the_difference():
    result = check_double(lambda x: x.exp())
    assert "max abs difference" in result.message and "none of the usual mistakes" in result.message


def test_exception_names_type_and_line_of_reader_code():
    def buggy(x):
        y = x * 2
        return y @ torch.ones(3)  # shape error on this line
    result = check_double(buggy)
    assert not result.passed and result.attempted
    assert "raised RuntimeError" in result.message
    assert "of your code: `return y @ torch.ones(3)" in result.message


def test_wrong_type_and_shape_are_reported():
    assert "should be a torch.Tensor", "got a list of" in check_double(lambda x: [1, 2]).message
    assert "has shape (2, 2), expected (4,)" in check_double(lambda x: torch.zeros(2, 2)).message
    assert "expected a function or class, got int" in check_double(3).message


def test_nan_is_reported_as_such():
    assert "contains NaN" in check_double(lambda x: x * float("nan")).message


def test_checker_bug_never_escapes():
    @checker("broken")
    def check_broken(candidate) -> str:
        raise KeyError("oops")
    result = check_broken(lambda: None)
    assert isinstance(result, CheckResult) and not result.passed and "KeyError" in result.message


def test_candidate_error_is_a_plain_failure():
    @checker("explicit")
    def check_explicit(candidate) -> str:
        raise CandidateError("your mask is inverted")
    assert check_explicit(None).message == "your mask is inverted"


def test_a_candidate_that_calls_sys_exit_is_reported_not_fatal():
    import sys

    from attnlib.exercises import check_stable_softmax

    def quits(x):
        sys.exit(3)

    result = check_stable_softmax(quits)
    assert not result.passed and result.attempted
    assert "SystemExit" in result.message


def test_a_candidate_that_changes_its_input_in_place_is_named_even_when_right():
    def doubles_in_place(x):
        x.mul_(2)  # the right numbers, but the caller's tensor is overwritten
        return x
    result = check_double(doubles_in_place)
    assert not result.passed and "changed x in place" in result.message


def test_in_place_softmax_fails_check_stable_softmax():
    from attnlib.exercises import check_stable_softmax

    def softmax_in_place(scores):
        scores -= scores.amax(dim=-1, keepdim=True)
        scores.exp_()
        scores /= scores.sum(dim=-1, keepdim=True)
        return torch.nan_to_num(scores)
    result = check_stable_softmax(softmax_in_place)
    assert not result.passed and "changed scores in place" in result.message, result.message


def test_complex_results_are_refused_by_every_checker():
    result = check_double(lambda x: (2 * x).to(torch.complex64))
    assert not result.passed and "complex tensor" in result.message


@pytest.mark.parametrize("flip, name", [
    (lambda: torch.use_deterministic_algorithms(True), "use_deterministic_algorithms"),
    (lambda: torch.autograd.set_detect_anomaly(True), "set_detect_anomaly"),
    (lambda: torch.set_num_threads(max(1, torch.get_num_threads() % 2 + 1)), "set_num_threads"),
])
def test_global_switches_a_candidate_leaves_flipped_are_put_back_and_named(flip, name):
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_anomaly_enabled(), torch.get_num_threads())

    def flips(x):
        flip()
        return 2 * x
    result = check_double(flips)
    assert not result.passed and name in result.message, result.message
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_anomaly_enabled(), torch.get_num_threads()) == before
