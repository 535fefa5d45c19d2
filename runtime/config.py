"""Loading a config module (`--config config_small` or a path) and its --set overrides.

A config module states each value once, as a module-level name, in Texar's
shape (config_small.py): its names that are schema() keys are the config, and
its other names (hidden_size, keep_prob, an import, a helper) only build them.
A --set of a top-level scalar of the file, a config key or not
(`--set keep_prob=0.5`, `--set num_epochs=1`), runs the file with that
assignment's value replaced, so every key built from it follows; a --set of
a scalar that builds no key is refused. A dotted --set
(`--set cell.kwargs.num_units=300`) replaces that one value of the result, so
it wins over the scalar the value was built from.

load_config merges, checks and validates a config once and returns it as one
read-only texar_lite.hparams.HParams; everything downstream reads that object
as it is. Each default lives in one place: the pieces' own in their
default_hparams() (cell: texar_lite/decoder.py, emb: texar_lite/embedder.py,
opt: texar_lite/optimization.py), which schema() composes, and the run-wide
optional keys' in schema().
"""
import ast
import copy
import importlib.util
import math
import os
import sys
import types

from core.errors import ConfigError
from texar_lite import decoder, embedder, optimization
from texar_lite.hparams import HParams, HParamsError, merge, parse_override

REQUIRED_KEYS = ("init_scale", "num_epochs", "batch_size", "num_steps", "cell", "emb", "opt")
SCALAR_TYPES = (bool, int, float, str)


def schema():
    """Every key a config may hold, with the type each must have.

    An optional key's value here is its default. A required key (REQUIRED_KEYS)
    has no default: its value here gives only the type. cell, emb and opt are
    the defaults of the pieces they configure, for the keys a config leaves out.
    """
    return {
        "init_scale": float(),
        "num_epochs": int(),
        "batch_size": int(),
        "num_steps": int(),
        "vocab_size": 10000,
        # "global" (Texar): batch_size is split across ranks. "per_worker"
        # (DeePMD-kit): every rank takes batch_size rows.
        "batch_mode": "global",
        # auto = linear in per_worker mode, none in global mode.
        "learning_rate": {"scale_by_worker": "auto"},
        # float32, or mixed_bfloat16 (bf16 matmuls, fp32 weights and loss).
        "precision": "float32",
        "cell": decoder.default_hparams(),
        "emb": embedder.default_hparams(),
        "opt": optimization.default_hparams(),
    }


def _config_file(name):
    """The .py file of config `name`: a module name (looked up from the working directory too) or a path."""
    if name.endswith(".py") or os.sep in name:
        if not os.path.isfile(name):
            raise ConfigError(f"--config {name}: no such file")
        return name
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not (spec.origin or "").endswith(".py"):
        raise ConfigError(f"unknown --config {name!r}: no module {name}.py here; "
                          "use config_small, config_medium, config_large or a path to a .py file")
    return spec.origin


def _replaceable_name(statement):
    """The name a top-level `NAME = value` (or `NAME: type = value`) statement assigns, else None."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target = statement.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


class _ConfigModule:
    """A config module's source, run as written or with top-level scalars given other values."""

    def __init__(self, name):
        self.name = name
        self.path = _config_file(name)
        self.module_name = os.path.basename(self.path)[:-3] if self.path == name else name
        self.shown = self.path if self.path == name else self.module_name + ".py"  # in error lines
        with open(self.path, encoding="utf-8") as f:
            source = f.read()
        try:
            self.tree = ast.parse(source, self.path)
        except SyntaxError as err:
            raise ConfigError(f"--config {name}: syntax error in {err.filename} line {err.lineno}: {err.msg}") from None
        namespace = self._run({})
        assigned = {_replaceable_name(statement) for statement in self.tree.body}
        # What a --set replaces in the source: the top-level scalar assignments, config keys among them.
        self.scalars = {key: value for key, value in namespace.items()
                        if key in assigned and isinstance(value, SCALAR_TYPES)}
        self.values = self._keys(namespace)

    def _run(self, replaced):
        tree = copy.deepcopy(self.tree)
        for statement in tree.body:
            name = _replaceable_name(statement)
            if name in replaced:
                statement.value = ast.copy_location(ast.Constant(replaced[name]), statement.value)
        module = types.ModuleType(self.module_name)
        module.__file__ = self.path
        try:
            exec(compile(tree, self.path, "exec"), module.__dict__)
        except ModuleNotFoundError as err:
            raise ConfigError(f"--config {self.name}: it imports {err.name!r}, which is not installed") from None
        for key, value in replaced.items():
            if module.__dict__.get(key, not value) != value:
                raise ConfigError(f"--set {key}: {self.shown} changes {key} after assigning it, so the value given "
                                  "would not hold; edit the file instead")
        return module.__dict__

    @staticmethod
    def _keys(namespace):
        return {key: namespace[key] for key in schema() if key in namespace}

    def keys(self, replaced):
        """The config keys the module sets when run with `replaced` (scalar name: value)."""
        return self._keys(self._run(replaced)) if replaced else self.values

    def builds_a_key(self, name, value):
        """Whether some key follows scalar `name`: the file reads it, and a new value changes a key."""
        read = any(isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)
                   for node in ast.walk(self.tree))
        return read and (value == self.scalars[name] or self.keys({name: value}) != self.values)


def load_config(name, overrides=()):
    """The config module `name` run with its --set overrides of top-level scalars, then merged
    with its dotted and optional-key overrides as from_values does (the module's docstring has the rules)."""
    module = _ConfigModule(name)
    replaced, rest = {}, []
    for text in overrides:
        key, equals, _ = text.partition("=")
        key = key.strip()
        if equals and key in module.scalars:
            try:
                value = parse_override(text, {key: schema().get(key, module.scalars[key])})[key]
            except HParamsError as err:
                raise ConfigError(str(err)) from None
            if key not in schema() and not module.builds_a_key(key, value):
                raise ConfigError(f"--set {text.strip()} changes no config key: {module.shown} builds none "
                                  f"from {key}; --set the key it should change")
            replaced[key] = value
        elif equals and "." not in key and key not in schema():
            others = sorted(set(module.scalars) - set(schema()))
            raise ConfigError(f"unknown hyperparameter '{key}' in --set '{text.strip()}' (config keys: "
                              f"{', '.join(sorted(schema()))}; other scalars of {module.shown}: "
                              f"{', '.join(others) or 'none'})")
        else:
            rest.append(text)
    values = module.keys(replaced)
    missing = [key for key in REQUIRED_KEYS if key not in values]
    if missing:
        raise ConfigError(f"--config {name} is missing {', '.join(missing)}; "
                          "set each as a module-level name, as config_small.py does")
    try:
        return from_values(values, module.module_name, rest)
    except ConfigError as err:
        # A bad value may be built from a scalar that is no key: the line names the --set it came from.
        given = ", ".join(f"{key}={value!r}" for key, value in replaced.items() if key not in schema())
        if not given:
            raise
        raise ConfigError(f"{err} ({module.shown} run with {given})") from None


def from_values(values, name, overrides=()):
    """`values` merged into schema(), each --set override applied, validated: one read-only
    HParams. It also holds the config's `name`, which is no hyperparameter: results.json
    reports it as "config", apart from the "hparams"."""
    try:
        merged = merge(values, schema())
        for text in overrides:
            # Typed by the merged values, so a kwarg of another optimizer type can be set too.
            merged = merge(parse_override(text, merged), merged)
    except HParamsError as err:
        raise ConfigError(str(err)) from None
    config = HParams(dict(merged, name=name), None)
    _validate(config)
    return config


def _validate(config):
    def need(ok, message):
        if not ok:
            raise ConfigError(message)

    for key in ("num_epochs", "batch_size", "num_steps", "vocab_size"):
        need(config[key] > 0, f"{key} must be > 0, got {config[key]}")
    need(config["init_scale"] > 0, f"init_scale must be > 0, got {config['init_scale']}")
    need(config["batch_mode"] in ("global", "per_worker"),
         f"batch_mode must be global or per_worker, got {config['batch_mode']!r}")
    need(config["learning_rate"]["scale_by_worker"] in ("auto", "linear", "sqrt", "none"),
         f"learning_rate.scale_by_worker must be auto, linear, sqrt or none, "
         f"got {config['learning_rate']['scale_by_worker']!r}")
    need(config["precision"] in ("float32", "mixed_bfloat16"),
         f"precision must be float32 or mixed_bfloat16, got {config['precision']!r}")
    cell = config["cell"]
    need(cell["num_layers"] > 0, f"cell.num_layers must be > 0, got {cell['num_layers']}")
    need(cell["kwargs"].get("num_units", 1) > 0, "cell.kwargs.num_units must be > 0")
    keep = cell["dropout"]["output_keep_prob"]
    need(0.0 < keep <= 1.0, f"cell.dropout.output_keep_prob must be in (0, 1], got {keep}")
    need(config["emb"]["dim"] > 0, f"emb.dim must be > 0, got {config['emb']['dim']}")
    need(0.0 <= config["emb"]["dropout_rate"] < 1.0,
         f"emb.dropout_rate must be in [0, 1), got {config['emb']['dropout_rate']}")
    lr = config["opt"]["optimizer"]["kwargs"].get("learning_rate")
    need(isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0,
         f"opt.optimizer.kwargs.learning_rate must be a finite number > 0, got {lr!r}")
    try:
        optimization.optimizer_class(config["opt"]["optimizer"]["type"])
        optimization.learning_rate_at_epoch(config["opt"], 0)
        decoder.check_hparams(cell)
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(str(err)) from None
