"""HParams: a user dict merged into defaults once, type-checked, unknown keys rejected; read-only."""
import copy
from collections.abc import Mapping


class HParamsError(ValueError):
    """A bad hyperparameter: unknown key, wrong type, or missing required key."""


def _type_name(value):
    return type(value).__name__


def _check_type(path, value, default):
    # None in the defaults means "anything goes" (e.g. optional kwargs).
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise HParamsError(f"{path} must be a bool, got {value!r} ({_type_name(value)})")
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)
    if not isinstance(value, type(default)) or (isinstance(value, bool) and not isinstance(default, bool)):
        raise HParamsError(
            f"{path} must be a {_type_name(default)}, got {value!r} ({_type_name(value)})")
    return value


def merge(hparams, defaults, path=""):
    """Returns a new dict: `defaults` overridden by `hparams`, recursively.

    A dict holding both "type" and "kwargs" follows Texar: when the user picks
    a different type, its kwargs belong to that type, so they are taken as
    given instead of being checked against the default type's kwargs.
    """
    if hparams is None:
        return copy.deepcopy(defaults)
    if not isinstance(hparams, dict):
        raise HParamsError(f"{path or 'hparams'} must be a dict, got {hparams!r}")
    merged = copy.deepcopy(defaults)
    free_kwargs = ("type" in defaults and "kwargs" in defaults
                   and hparams.get("type", defaults["type"]) != defaults["type"])
    for key, value in hparams.items():
        key_path = f"{path}.{key}" if path else key
        if key not in defaults:
            known = ", ".join(sorted(defaults))
            raise HParamsError(f"unknown hyperparameter '{key_path}' (known here: {known})")
        default = defaults[key]
        if key == "kwargs" and free_kwargs:
            merged[key] = copy.deepcopy(value)
        elif isinstance(default, dict) and default:
            merged[key] = merge(value, default, key_path)
        else:
            merged[key] = _check_type(key_path, value, default)
    return merged


class HParams(Mapping):
    """Read-only hyperparameters, with attribute and item access.

    HParams(hparams, default_hparams) merges `hparams` into the defaults once
    (type-checked, unknown keys refused); HParams(values, None) takes values
    that are merged already as they are, as Texar's HParams does. Nested dicts
    become nested HParams, built here once: reading `hp.cell` returns the same
    object every time and checks nothing again. A module takes its HParams
    merged already and uses them as they are:

    >>> WordEmbedder(vocab_size, HParams({"dim": 64}, embedder.default_hparams()))
    """

    def __init__(self, hparams, default_hparams):
        values = hparams if default_hparams is None else merge(hparams, default_hparams)
        if not isinstance(values, dict):
            raise HParamsError(f"hparams must be a dict, got {values!r}")
        object.__setattr__(self, "_values", {key: _frozen(value) for key, value in values.items()})

    def __getattr__(self, name):
        # Private and special names are Python's (copy, pickle), never hyperparameters.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no hyperparameter '{name}'") from None

    def __setattr__(self, name, value):
        raise AttributeError("HParams are read-only; build a new one from a dict")

    def __delattr__(self, name):
        raise AttributeError("HParams are read-only; build a new one from a dict")

    def __getitem__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"no hyperparameter '{name}'") from None

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        return f"HParams({self.todict()!r})"

    def todict(self):
        """Plain, nested dicts and lists (results.json's "hparams"); changing them changes nothing here."""
        return {key: _plain(value) for key, value in self._values.items()}


def _frozen(value):
    if isinstance(value, dict):
        return HParams(value, None)
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    return value


def _plain(value):
    if isinstance(value, HParams):
        return value.todict()
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def expect_merged(hparams, owner):
    """`hparams` itself when it is an HParams: `owner` takes its hyperparameters merged already."""
    if not isinstance(hparams, HParams):
        raise TypeError(f"{owner} takes HParams, got a {type(hparams).__name__}: merge the values once with "
                        "HParams(values, default_hparams())")
    return hparams


def parse_override(text, defaults):
    """Turns 'a.b.c=VALUE' into a nested dict typed like defaults['a']['b']['c'].

    The value is parsed with the default's type, so `--set num_epochs=2` is an
    int and `--set emb.dropout_rate=0.5` a float; a key that does not exist raises.
    """
    if "=" not in text:
        raise HParamsError(f"--set {text!r} is not KEY=VALUE (e.g. --set num_epochs=1)")
    dotted, raw = text.split("=", 1)
    keys = dotted.strip().split(".")
    node, path = defaults, ""
    for key in keys:
        path = f"{path}.{key}" if path else key
        if not isinstance(node, dict) or key not in node:
            known = ", ".join(sorted(node)) if isinstance(node, dict) else "none"
            raise HParamsError(f"unknown hyperparameter '{path}' in --set {text!r} (known here: {known})")
        node = node[key]
    value = _parse_value(path, raw.strip(), node)
    for key in reversed(keys):
        value = {key: value}
    return value


def _parse_value(path, raw, default):
    try:
        if isinstance(default, bool):
            lowered = raw.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError
            return lowered in ("true", "1")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, str):
            return raw
    except ValueError:
        raise HParamsError(
            f"--set {path}={raw}: expected a {_type_name(default)}, got {raw!r}") from None
    raise HParamsError(f"--set {path}: a {_type_name(default)} cannot be set from the command line; "
                       "edit the config module instead")

