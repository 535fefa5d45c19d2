"""HParams: a user dict merged into defaults, type-checked, unknown keys rejected."""
import copy


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


class HParams:
    """Read-only attribute access over merged hyperparameters.

    >>> hp = HParams({"cell": {"num_layers": 3}}, defaults)
    >>> hp.cell.num_layers
    3
    """

    def __init__(self, hparams, default_hparams):
        object.__setattr__(self, "_values", merge(hparams, default_hparams))

    def __getattr__(self, name):
        try:
            value = self._values[name]
        except KeyError:
            raise AttributeError(f"no hyperparameter '{name}'") from None
        return HParams(value, value) if isinstance(value, dict) and value else value

    def __setattr__(self, name, value):
        raise AttributeError("HParams are read-only; build a new one from a dict")

    def __getitem__(self, name):
        return self.__getattr__(name)

    def __contains__(self, name):
        return name in self._values

    def todict(self):
        return copy.deepcopy(self._values)


def parse_override(text, defaults):
    """Turns 'a.b.c=VALUE' into a nested dict typed like defaults['a']['b']['c'].

    The value is parsed with the default's type, so `--set num_epochs=2` is an
    int and `--set keep_prob=0.5` a float; a key that does not exist raises.
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


def deep_update(base, update):
    """Merges nested dict `update` into a copy of `base` (no checking; merge() checks)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
