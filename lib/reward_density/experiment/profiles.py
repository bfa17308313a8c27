"""YAML profiles (params/*.yaml): loading, validation, the matrix of cells and each cell's config.

A profile is validated once, completely, by `load_profile`, before any work starts; every problem is a
`ProfileError` naming the file, the dotted key and what was expected. Its `cell`, `world` and `data`
sections are checked against the cell schema (`config.CellConfig`): a key the schema does not know is an
error, and a key the profile leaves out takes the schema's default.

World entries are either local paths or hub ids. The rule (`is_local_path`): a value is a local path
when it starts with "/", "~" or ".", when its first component is "outputs", or when it exists relative
to the root; anything else (e.g. "Qwen/Qwen3-1.7B-Base") is a hub id and is passed on untouched.
Local paths are made absolute against the root (the repository checkout by default).
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import yaml

from ..rewards import REGIMES
from .checks import (
    Checker,
    InvalidValue,
    boolean,
    non_empty_string,
    non_negative_int,
    one_of,
    open_unit_number,
    positive_int,
    positive_number,
)
from .config import CellConfig, cell_name, parse_rank

# The checkout holding params/, notebooks/ and outputs/ (the package is installed editable from lib/).
REPO_ROOT = Path(__file__).resolve().parents[3]

TOP_REQUIRED = ("profile", "world", "matrix", "analysis")
TOP_OPTIONAL = ("cell", "build_world", "data", "cluster")
MATRIX_KEYS = ("regimes", "ranks", "full_ft", "seeds", "learning_rate")
DATA_REQUIRED = ("prompt_template",)  # a data section exists to say how MATH rows become prompts

ANALYSIS_SCHEMA: dict[str, Checker] = {
    "equivalence_margin": positive_number,
    "bootstrap_samples": positive_int,
    "confidence": open_unit_number,
}


class ProfileError(ValueError):
    """A profile that cannot be used: the message names the file, the key and what was expected."""


@dataclass(frozen=True)
class Matrix:
    """The sweep: regimes x (ranks + FullFT) x seeds, with one learning rate per arm ("lora", "full")."""

    regimes: tuple[str, ...]
    ranks: tuple[int, ...]
    full_ft: bool
    seeds: tuple[int, ...]
    learning_rate: dict[str, float]

    def learning_rate_of(self, rank: int | None) -> float:
        """The learning rate of an arm (rank None: FullFT)."""
        arm = "full" if rank is None else "lora"
        if arm not in self.learning_rate:
            raise ValueError(f"the profile has no matrix.learning_rate.{arm}")
        return self.learning_rate[arm]


@dataclass(frozen=True)
class MatrixCell:
    """One training run of the matrix; rank None means full fine-tuning."""

    regime: str
    rank: int | None
    seed: int
    learning_rate: float

    @property
    def name(self) -> str:
        """The cell's folder name, e.g. outcome-r4-s0 or process-rfull-s2."""
        return cell_name(self.regime, self.rank, self.seed)


@dataclass(frozen=True)
class Profile:
    """A validated profile; see params/mini.yaml for the meaning of each key."""

    name: str
    path: Path
    world: dict[str, str]
    build_world: dict[str, Any] | None
    data: dict[str, Any]  # how MATH-schema datasets become prompts; empty for the mini world's own files
    cluster: dict[str, Any]  # submitit executor settings for `--executor` (run/slurm.py); empty if none
    matrix: Matrix
    cell: dict[str, Any]  # every setting of section "cell": the profile's value or the schema default
    analysis: dict[str, Any]

    def cells(self) -> list[MatrixCell]:
        """All cells: regimes outer, then ranks ascending then FullFT, then seeds."""
        ranks: list[int | None] = [*sorted(self.matrix.ranks), *([None] if self.matrix.full_ft else [])]
        return [
            MatrixCell(regime, rank, seed, self.matrix.learning_rate_of(rank))
            for regime in self.matrix.regimes
            for rank in ranks
            for seed in self.matrix.seeds
        ]

    def cells_dir(self, root: Path) -> Path:
        """Where the cells of this profile live under a project root."""
        return Path(root) / "outputs" / self.name / "cells"


def cell_config(
    profile: Profile, regime: str, rank: int | str | None, seed: int, *, learning_rate: float | None = None,
    out_dir: str | Path | None = None, root: Path = REPO_ROOT, **settings: Any,
) -> CellConfig:
    """The config of one cell: the profile's settings for the arm, then any settings given here.

    learning_rate None takes the profile's rate for the arm; out_dir None the cell's folder under root;
    settings may override any other CellConfig field (local world paths are made absolute against root).
    """
    known = {f.name for f in CellConfig.settings()}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown cell settings {unknown}; known: {sorted(known)}")
    rank = parse_rank(rank)
    values = {**profile.cell, **profile.data, **profile.world, **settings}
    for f in CellConfig.settings("world"):
        if values.get(f.name) is not None:
            values[f.name] = resolve_world_entry(values[f.name], root)
    values.update(
        regime=regime, rank=rank, seed=seed, profile=profile.name,
        learning_rate=profile.matrix.learning_rate_of(rank) if learning_rate is None else learning_rate,
        out_dir=str(resolve_path(out_dir or profile.cells_dir(root) / cell_name(regime, rank, seed), root)),
    )
    return CellConfig(**values)


def is_local_path(value: str, root: Path) -> bool:
    """Whether a world entry names a local path (see the module docstring) rather than a hub id."""
    return value.startswith(("/", "~", ".")) or Path(value).parts[:1] == ("outputs",) or (root / value).exists()


def resolve_path(path: str | Path, root: Path) -> Path:
    """A path made absolute against root (home expanded)."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else (Path(root) / path).resolve()


def resolve_world_entry(value: str, root: Path) -> str:
    """A local path made absolute against root; a hub id unchanged."""
    return str(resolve_path(value, root)) if is_local_path(value, root) else value


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


def _schema(section: str) -> tuple[dict[str, Checker], dict[str, Any]]:
    """The checkers of a CellConfig section's fields, and the defaults of those that have one."""
    found = CellConfig.settings(section)
    return ({f.name: f.metadata["check"] for f in found},
            {f.name: f.default for f in found if f.default is not MISSING})


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
        except InvalidValue as exc:
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

    def schema(self, key: str, value: Any, checkers: dict[str, Checker], defaults: dict[str, Any]) -> dict[str, Any]:
        """A mapping checked key by key; keys with a default may be left out and take it."""
        required = tuple(k for k in checkers if k not in defaults)
        data = self.mapping(key, value, required, tuple(k for k in checkers if k in defaults))
        return {k: self.check(self.join(key, k), data[k], check) for k, check in checkers.items() if k in data}

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
        build_world = data.get("build_world")
        if "build_world" in data and not isinstance(build_world, dict):
            raise self.error("build_world", build_world, "a mapping of the world notebook's parameters")
        if build_world is not None and not isinstance(build_world.get("out_dir"), str):
            raise self.error("build_world.out_dir", build_world.get("out_dir"), "the folder the world is built in")
        cell_checks, cell_defaults = _schema("cell")
        return Profile(
            name=name,
            path=self.path,
            world=self.schema("world", data["world"], *_schema("world")),
            build_world=build_world,
            data=self.data(data["data"]) if "data" in data else {},
            cluster=self.cluster(data["cluster"]) if "cluster" in data else {},
            matrix=self.matrix(data["matrix"]),
            cell=cell_defaults | self.schema("cell", data.get("cell", {}), cell_checks, cell_defaults),
            analysis=self.schema("analysis", data["analysis"], ANALYSIS_SCHEMA, {}),
        )

    def data(self, value: Any) -> dict[str, Any]:
        """The validated data section: a prompt template and, optionally, the dataset subsets to read."""
        checks, _ = _schema("data")
        data = self.mapping("data", value, DATA_REQUIRED, tuple(k for k in checks if k not in DATA_REQUIRED))
        checked = {k: self.check(f"data.{k}", data[k], checks[k]) for k in data}
        if "problem_subsets" in checked:
            checked["problem_subsets"] = list(self.unique_list("data.problem_subsets", data["problem_subsets"],
                                                               non_empty_string))
        return checked

    def cluster(self, value: Any) -> dict[str, Any]:
        """submitit's executor settings; timeout_min is required (its default kills a job within minutes).

        The names themselves are checked by submitit when the executor is made, before any cell runs.
        """
        data = self.mapping("cluster", value, ("timeout_min",), tuple(k for k in (value or {}) if isinstance(k, str)))
        self.check("cluster.timeout_min", data["timeout_min"], positive_int)
        return dict(data)

    def matrix(self, value: Any) -> Matrix:
        """The validated matrix section; learning_rate.full is needed only when full_ft is true."""
        data = self.mapping("matrix", value, MATRIX_KEYS)
        full_ft = self.check("matrix.full_ft", data["full_ft"], boolean)
        rates = self.mapping("matrix.learning_rate", data["learning_rate"], ("lora", "full") if full_ft else ("lora",),
                             () if full_ft else ("full",))
        return Matrix(
            regimes=self.unique_list("matrix.regimes", data["regimes"], one_of(*REGIMES)),
            ranks=self.unique_list("matrix.ranks", data["ranks"], positive_int),
            full_ft=full_ft,
            seeds=self.unique_list("matrix.seeds", data["seeds"], non_negative_int),
            learning_rate={k: self.check(f"matrix.learning_rate.{k}", v, positive_number) for k, v in rates.items()},
        )
