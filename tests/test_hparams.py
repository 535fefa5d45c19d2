"""HParams merge, type errors, unknown keys, and --set parsing."""
import pytest

from texar_lite.hparams import HParams, HParamsError, merge, parse_override

DEFAULTS = {
    "dim": 200,
    "rate": 0.5,
    "flag": True,
    "name": "x",
    "opt": {"type": "SGD", "kwargs": {"learning_rate": 1.0}, "clip": {"norm": 5.0}},
}


def test_merge_overrides_nested_values_and_keeps_the_rest():
    merged = merge({"dim": 64, "opt": {"clip": {"norm": 2.0}}}, DEFAULTS)
    assert merged == {"dim": 64, "rate": 0.5, "flag": True, "name": "x",
                      "opt": {"type": "SGD", "kwargs": {"learning_rate": 1.0}, "clip": {"norm": 2.0}}}
    assert DEFAULTS["opt"]["clip"]["norm"] == 5.0  # defaults untouched


def test_int_is_accepted_for_float_and_converted():
    assert merge({"rate": 1}, DEFAULTS)["rate"] == 1.0
    assert isinstance(merge({"rate": 1}, DEFAULTS)["rate"], float)


@pytest.mark.parametrize("override, message", [
    ({"dim": "big"}, "dim must be a int, got 'big' (str)"),
    ({"dim": 1.5}, "dim must be a int, got 1.5 (float)"),
    ({"flag": 1}, "flag must be a bool, got 1 (int)"),
    ({"dim": True}, "dim must be a int, got True (bool)"),
    ({"opt": {"clip": {"norm": "5"}}}, "opt.clip.norm must be a float, got '5' (str)"),
])
def test_type_errors_name_the_full_path(override, message):
    with pytest.raises(HParamsError) as err:
        merge(override, DEFAULTS)
    assert str(err.value) == message


def test_unknown_key_is_rejected_with_its_full_path():
    with pytest.raises(HParamsError) as err:
        merge({"opt": {"clip": {"nrom": 1.0}}}, DEFAULTS)
    assert str(err.value) == "unknown hyperparameter 'opt.clip.nrom' (known here: norm)"


def test_a_new_type_takes_its_own_kwargs():
    merged = merge({"opt": {"type": "Adam", "kwargs": {"beta_1": 0.8}}}, DEFAULTS)
    assert merged["opt"]["kwargs"] == {"beta_1": 0.8}
    with pytest.raises(HParamsError, match="opt.kwargs.beta_1"):
        merge({"opt": {"kwargs": {"beta_1": 0.8}}}, DEFAULTS)  # same type: checked


def test_attribute_access_and_read_only():
    hp = HParams({"opt": {"clip": {"norm": 1.0}}}, DEFAULTS)
    assert hp.opt.clip.norm == 1.0
    assert hp.dim == 200
    assert hp.todict()["opt"]["type"] == "SGD"
    with pytest.raises(AttributeError):
        hp.dim = 3


@pytest.mark.parametrize("text, expected", [
    ("dim=64", {"dim": 64}),
    ("rate=0.25", {"rate": 0.25}),
    ("flag=false", {"flag": False}),
    ("name=abc", {"name": "abc"}),
    ("opt.clip.norm=2", {"opt": {"clip": {"norm": 2.0}}}),
])
def test_parse_override_types_values_like_the_default(text, expected):
    assert parse_override(text, DEFAULTS) == expected


@pytest.mark.parametrize("text, message", [
    ("dim=abc", "--set dim=abc: expected a int, got 'abc'"),
    ("opt.clip.nrom=2", "unknown hyperparameter 'opt.clip.nrom' in --set 'opt.clip.nrom=2' (known here: norm)"),
    ("dim", "--set 'dim' is not KEY=VALUE (e.g. --set num_epochs=1)"),
])
def test_parse_override_errors(text, message):
    with pytest.raises(HParamsError) as err:
        parse_override(text, DEFAULTS)
    assert str(err.value) == message
