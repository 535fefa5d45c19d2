"""HParams merge, type errors, unknown keys, read-only access, and --set parsing."""
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


def test_attribute_and_item_access():
    hp = HParams({"opt": {"clip": {"norm": 1.0}}}, DEFAULTS)
    assert hp.opt.clip.norm == hp["opt"]["clip"]["norm"] == 1.0
    assert hp.dim == 200
    assert list(hp) == ["dim", "rate", "flag", "name", "opt"] and len(hp) == 5
    assert "opt" in hp and "nope" not in hp
    assert hp.get("rate") == 0.5 and hp.get("nope", 7) == 7
    assert isinstance(hp.opt, HParams) and hp.opt is hp["opt"]  # nested HParams are built once
    assert hp.todict() == merge({"opt": {"clip": {"norm": 1.0}}}, DEFAULTS)
    assert hp == hp.todict()
    with pytest.raises(AttributeError, match="no hyperparameter 'nope'"):
        hp.nope
    with pytest.raises(KeyError, match="no hyperparameter 'nope'"):
        hp["nope"]


def test_hparams_are_read_only_at_every_level():
    hp = HParams({"steps": [1, 2]}, {"steps": [3], "opt": {"clip": {"norm": 5.0}}})
    with pytest.raises(AttributeError, match="HParams are read-only"):
        hp.opt = 3
    with pytest.raises(AttributeError, match="HParams are read-only"):
        hp.opt.clip.norm = 1.0
    with pytest.raises(AttributeError, match="HParams are read-only"):
        del hp.opt
    with pytest.raises(TypeError):
        hp["opt"] = 3
    with pytest.raises(TypeError):
        hp.opt["clip"]["norm"] = 1.0
    with pytest.raises(AttributeError):
        hp.steps.append(3)  # a list is held as a tuple
    plain = hp.todict()
    plain["opt"]["clip"]["norm"] = 1.0
    plain["steps"].append(3)
    assert plain == {"steps": [1, 2, 3], "opt": {"clip": {"norm": 1.0}}}
    assert hp.todict() == {"steps": [1, 2], "opt": {"clip": {"norm": 5.0}}}


def test_none_defaults_take_merged_values_as_they_are():
    merged = merge({"dim": 64}, DEFAULTS)
    hp = HParams(merged, None)
    assert hp.todict() == merged
    merged["opt"]["clip"]["norm"] = 0.0  # the HParams hold their own copy
    assert hp.opt.clip.norm == 5.0
    # Nothing is checked or filled in: that is merge's work, done once before.
    assert HParams({"anything": "x"}, None).todict() == {"anything": "x"}
    with pytest.raises(HParamsError, match="hparams must be a dict, got 3"):
        HParams(3, None)


def test_unknown_key_is_rejected_when_hparams_are_built():
    with pytest.raises(HParamsError) as err:
        HParams({"opt": {"clip": {"nrom": 1.0}}}, DEFAULTS)
    assert str(err.value) == "unknown hyperparameter 'opt.clip.nrom' (known here: norm)"


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
