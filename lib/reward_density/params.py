"""YAML profiles (params/*.yaml): loading, validation and expansion into the matrix of cells.

A profile is validated once, completely, by `load_profile`, before any work starts; every problem is a
`ProfileError` naming the file, the dotted key and what was expected.

World entries are either local paths or hub ids. The rule (`is_local_path`): a value is a local path
when it starts with "/", "~" or ".", when its first component is "outputs", or when it exists relative
to the root; anything else (e.g. "Qwen/Qwen3-1.7B-Base") is a hub id and is passed on untouched.
Local paths are made absolute against the root (the repository checkout by default).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The checkout holding params/, notebooks/ and outputs/ (the package is installed editable from lib/).
REPO_ROOT = Path(__file__).resolve().parents[2]

KL_ESTIMATORS = ("paper", "k3", "k1")
LOSS_NORMALISATIONS = ("token_mean", "sequence_mean", "constant")
WORLD_REQUIRED = ("student", "teacher", "prm", "problems")
WORLD_OPTIONAL = ("heldout",)
TOP_REQUIRED = ("profile", "world", "matrix", "cell", "analysis")
TOP_OPTIONAL = ("build_world", "data", "cluster")
PRECISIONS = ("fp32", "bf16")
MATRIX_KEYS = ("regimes", "ranks", "full_ft", "seeds", "learning_rate")


class ProfileError(ValueError):
    """A profile that cannot be used: the message names the file, the key and what was expected."""


class _Invalid(Exception):
    """Raised by a checker with the expectation the value failed."""


Checker = Callable[[Any], Any]


def _is_int(value: Any) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any, expected: str) -> int | float:
    """The value itself when it is a number, else _Invalid (with a hint for YAML's '3e-4 is a string' trap)."""
    if _is_int(value) or isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:
            expected += " (YAML reads this as a string: write it with a dot and a signed exponent, e.g. 3.0e-4)"
    raise _Invalid(expected)


def positive_int(value: Any) -> int:
    """A positive integer (bool excluded)."""
    if not _is_int(value) or value <= 0:
        raise _Invalid("a positive integer")
    return value


def non_negative_int(value: Any) -> int:
    """A non-negative integer (bool excluded)."""
    if not _is_int(value) or value < 0:
        raise _Invalid("a non-negative integer")
    return value


def int_at_least_two(value: Any) -> int:
    """An integer >= 2 (a group needs two samples to have a spread)."""
    if not _is_int(value) or value < 2:
        raise _Invalid("an integer >= 2")
    return value


def positive_number(value: Any) -> int | float:
    """A number > 0."""
    number = _number(value, "a positive number")
    if number <= 0:
        raise _Invalid("a positive number")
    return number


def non_negative_number(value: Any) -> int | float:
    """A number >= 0."""
    number = _number(value, "a number >= 0")
    if number < 0:
        raise _Invalid("a number >= 0")
    return number


def top_p_number(value: Any) -> int | float:
    """A number in (0, 1]."""
    number = _number(value, "a number in (0, 1]")
    if not 0 < number <= 1:
        raise _Invalid("a number in (0, 1]")
    return number


def dropout_number(value: Any) -> int | float:
    """A number in [0, 1)."""
    number = _number(value, "a number in [0, 1)")
    if not 0 <= number < 1:
        raise _Invalid("a number in [0, 1)")
    return number


def open_unit_number(value: Any) -> int | float:
    """A number in (0, 1)."""
    number = _number(value, "a number in (0, 1)")
    if not 0 < number < 1:
        raise _Invalid("a number in (0, 1)")
    return number


def boolean(value: Any) -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise _Invalid("true or false")
    return value


def non_empty_string(value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("a non-empty string")
    return value


def prompt_template(value: Any) -> str:
    """A string holding the placeholder {problem} exactly once."""
    if not isinstance(value, str) or value.count("{problem}") != 1:
        raise _Invalid("a string with the placeholder {problem} exactly once")
    return value


def one_of(*choices: str) -> Checker:
    """A checker accepting exactly one of the given strings."""

    def check(value: Any) -> str:
        if value not in choices:
            raise _Invalid(f"one of {', '.join(choices)}")
        return value

    return check


CELL_SCHEMA: dict[str, Checker] = {
    "steps": positive_int,
    "prompts_per_step": positive_int,
    "group_size": int_at_least_two,
    "temperature": positive_number,
    "top_p": top_p_number,
    "max_new_tokens": positive_int,
    "beta": non_negative_number,
    "kl_estimator": one_of(*KL_ESTIMATORS),
    "loss_normalisation": one_of(*LOSS_NORMALISATIONS),
    "eval_every": positive_int,
    "eval_problems": positive_int,
    "eval_max_new_tokens": positive_int,
    "eval_batch_size": positive_int,
    "lora_alpha": positive_number,
    "lora_dropout": dropout_number,
    "weight_decay": non_negative_number,
    "max_grad_norm": positive_number,
    "advantage_eps": positive_number,
    "device": non_empty_string,
    "teacher_device": non_empty_string,
    "prm_device": non_empty_string,
    "precision": one_of(*PRECISIONS),
    "micro_batch_size": positive_int,
    "gradient_checkpointing": boolean,
}

ANALYSIS_SCHEMA: dict[str, Checker] = {
    "equivalence_margin": positive_number,
    "bootstrap_samples": positive_int,
    "confidence": open_unit_number,
}


@dataclass(frozen=True)
class Matrix:
    """The sweep: regimes x (ranks + FullFT) x seeds, with one learning rate per arm."""

    regimes: tuple[str, ...]
    ranks: tuple[int, ...]
    full_ft: bool
    seeds: tuple[int, ...]
    learning_rate: dict[str, float]


@dataclass(frozen=True)
class Cell:
    """One training run of the matrix; rank None means full fine-tuning."""

    regime: str
    rank: int | None
    seed: int
    learning_rate: float

    @property
    def name(self) -> str:
        """The cell's folder name, e.g. outcome-r4-s0 or process-rfull-s2."""
        rank = "full" if self.rank is None else self.rank
        return f"{self.regime}-r{rank}-s{self.seed}"

    def parameters(self, profile: Profile, out_dir: Path, root: Path = REPO_ROOT) -> dict[str, Any]:
        """The papermill parameters of the training notebook for this cell."""
        return {
            **profile.cell,
            "regime": self.regime,
            "rank": "full" if self.rank is None else self.rank,
            "seed": self.seed,
            "learning_rate": self.learning_rate,
            "out_dir": str(out_dir),
            "profile": profile.name,
            **profile.data,
            **{key: resolve_world_entry(value, root) for key, value in profile.world.items()},
        }


@dataclass(frozen=True)
class Profile:
    """A validated profile; see params/mini.yaml for the meaning of each key."""

    name: str
    path: Path
    world: dict[str, str]
    build_world: dict[str, Any] | None
    data: dict[str, Any]  # how MATH-schema datasets become prompts; empty for the mini world's own files
    cluster: dict[str, Any]  # submitit executor settings for `--executor` (scale_out.py); empty if none
    matrix: Matrix
    cell: dict[str, Any]
    analysis: dict[str, Any]

    def cells(self) -> list[Cell]:
        """All cells: regimes outer, then ranks ascending then FullFT, then seeds."""
        lr = self.matrix.learning_rate
        arms: list[tuple[int | None, float]] = [(rank, lr["lora"]) for rank in sorted(self.matrix.ranks)]
        if self.matrix.full_ft:
            arms.append((None, lr["full"]))
        return [
            Cell(regime, rank, seed, rate)
            for regime in self.matrix.regimes
            for rank, rate in arms
            for seed in self.matrix.seeds
        ]


def is_local_path(value: str, root: Path) -> bool:
    """Whether a world entry names a local path (see the module docstring) rather than a hub id."""
    return value.startswith(("/", "~", ".")) or Path(value).parts[:1] == ("outputs",) or (root / value).exists()


def resolve_world_entry(value: str, root: Path) -> str:
    """A local path made absolute against root; a hub id unchanged."""
    if not is_local_path(value, root):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (root / path).resolve())


def find_profile(spec: str, root: Path = REPO_ROOT) -> Path:
    """The YAML file of a profile given by name (looked up in root/params) or by path."""
    if spec.endswith((".yaml", ".yml")) or "/" in spec:
        path = Path(spec)
    else:
        path = root / "params" / f"{spec}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in (root / "params").glob("*.yaml"))) or "none"
        raise ProfileError(f"{path}: no such profile file (profiles in {root / 'params'}: {known})")
    return path


def load_profile(path: str | Path) -> Profile:
    """Read and fully validate a profile; every problem is a ProfileError naming file and key."""
    path = Path(path)
    try:
        with path.open() as stream:
            data = yaml.safe_load(stream)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the profile: {exc}") from exc
    return _Validator(path).profile(data)


class _Validator:
    """Checks one profile's data, raising ProfileError with file and dotted key."""

    def __init__(self, path: Path):
        self.path = path

    def error(self, key: str, value: Any, expected: str) -> ProfileError:
        """A ProfileError for one key."""
        return ProfileError(f"{self.path}: {key} = {value!r}: expected {expected}")

    def check(self, key: str, value: Any, checker: Checker) -> Any:
        """The checked value of one key."""
        try:
            return checker(value)
        except _Invalid as exc:
            raise self.error(key, value, str(exc)) from None

    def mapping(self, key: str, value: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        """A mapping with exactly the required keys and some of the optional ones."""
        allowed = required + optional
        where = key or "the profile"
        if not isinstance(value, dict):
            raise ProfileError(f"{self.path}: {where} = {value!r}: expected a mapping with keys {', '.join(allowed)}")
        unknown = [k for k in value if k not in allowed]
        if unknown:
            dotted = self.join(key, unknown[0])
            raise ProfileError(f"{self.path}: {dotted}: unknown key; allowed keys in {where}: {', '.join(allowed)}")
        missing = [k for k in required if k not in value]
        if missing:
            dotted = self.join(key, missing[0])
            raise ProfileError(f"{self.path}: {dotted}: missing key (required in {where}: {', '.join(required)})")
        return value

    @staticmethod
    def join(key: str, child: Any) -> str:
        """The dotted key of a child."""
        return f"{key}.{child}" if key else str(child)

    def schema(self, key: str, value: Any, schema: dict[str, Checker]) -> dict[str, Any]:
        """A mapping whose every key is in the schema and checked by it."""
        data = self.mapping(key, value, tuple(schema))
        return {k: self.check(self.join(key, k), data[k], checker) for k, checker in schema.items()}

    def unique_list(self, key: str, value: Any, checker: Checker) -> tuple:
        """A non-empty list of unique items, each checked."""
        if not isinstance(value, list) or not value:
            raise self.error(key, value, "a non-empty list")
        items = tuple(self.check(f"{key}[{i}]", item, checker) for i, item in enumerate(value))
        for i, item in enumerate(items):
            if item in items[:i]:
                raise self.error(f"{key}[{i}]", item, "unique values (it is repeated)")
        return items

    def profile(self, data: Any) -> Profile:
        """The validated Profile."""
        data = self.mapping("", data, TOP_REQUIRED, TOP_OPTIONAL)
        name = self.check("profile", data["profile"], non_empty_string)
        if name != self.path.stem:
            raise self.error("profile", name, f"the file's stem {self.path.stem!r}")
        world = self.mapping("world", data["world"], WORLD_REQUIRED, WORLD_OPTIONAL)
        world = {k: self.check(f"world.{k}", v, non_empty_string) for k, v in world.items()}
        build_world = data.get("build_world")
        if "build_world" in data and not isinstance(build_world, dict):
            raise self.error("build_world", build_world, "a mapping of the world notebook's parameters")
        if build_world is not None and not isinstance(build_world.get("out_dir"), str):
            raise self.error("build_world.out_dir", build_world.get("out_dir"), "the folder the world is built in")
        return Profile(
            name=name,
            path=self.path,
            world=world,
            build_world=build_world,
            data=self.data(data["data"]) if "data" in data else {},
            cluster=self.cluster(data["cluster"]) if "cluster" in data else {},
            matrix=self.matrix(data["matrix"]),
            cell=self.schema("cell", data["cell"], CELL_SCHEMA),
            analysis=self.schema("analysis", data["analysis"], ANALYSIS_SCHEMA),
        )

    def data(self, value: Any) -> dict[str, Any]:
        """The validated data section: a prompt template and, optionally, the dataset subsets to read."""
        data = self.mapping("data", value, ("prompt_template",), ("problem_subsets",))
        checked = {"prompt_template": self.check("data.prompt_template", data["prompt_template"], prompt_template)}
        if "problem_subsets" in data:
            subsets = self.unique_list("data.problem_subsets", data["problem_subsets"], non_empty_string)
            checked["problem_subsets"] = list(subsets)
        return checked

    def cluster(self, value: Any) -> dict[str, Any]:
        """submitit's executor settings; timeout_min is required (its default kills a job within minutes).

        The names themselves are checked by submitit when the executor is made, before any cell runs.
        """
        data = self.mapping("cluster", value, ("timeout_min",), tuple(k for k in (value or {}) if isinstance(k, str)))
        self.check("cluster.timeout_min", data["timeout_min"], positive_int)
        return dict(data)

    def matrix(self, value: Any) -> Matrix:
        """The validated matrix section."""
        from .rewards import REGIMES  # deferred: the rewards package imports torch

        data = self.mapping("matrix", value, MATRIX_KEYS)
        full_ft = self.check("matrix.full_ft", data["full_ft"], boolean)
        rates = ("lora", "full") if full_ft else ("lora",)
        if not full_ft and isinstance(data["learning_rate"], dict) and "full" in data["learning_rate"]:
            raise ProfileError(f"{self.path}: matrix.learning_rate.full: given, but matrix.full_ft is false")
        lr = self.mapping("matrix.learning_rate", data["learning_rate"], rates)
        return Matrix(
            regimes=self.unique_list("matrix.regimes", data["regimes"], one_of(*REGIMES)),
            ranks=self.unique_list("matrix.ranks", data["ranks"], positive_int),
            full_ft=full_ft,
            seeds=self.unique_list("matrix.seeds", data["seeds"], non_negative_int),
            learning_rate={k: self.check(f"matrix.learning_rate.{k}", lr[k], positive_number) for k in rates},
        )
