"""YAML profiles (params/*.yaml): loading, validation, the matrix of cells and each cell's config.

A profile is validated once, completely, by `load_profile`, before any work starts; every problem is a
`ProfileError` naming the file, the dotted key and what was expected. Its `cell`, `world` and `data`
sections are checked against the cell schema (`config.CellConfig`): a key the schema does not know is an
error, and a key the profile leaves out takes the schema's default.

World entries are either local paths or hub ids. The rule (`is_local_path`): a value is a local path
when it starts with "/", "~" or ".", when its first component is "outputs", when it cannot be a hub id (more
than one "/", or a data file's name: a missing local copy is then named as missing, not looked up on the hub), or
when it exists relative to the root; anything else (e.g. "Qwen/Qwen3-1.7B-Base") is a hub id and is passed on
untouched.
Local paths are made absolute against the root (the repository checkout by default).
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..data.sources import looks_local
from .checks import (
    Checker,
    InvalidValue,
    boolean,
    label_mapping,
    non_empty_string,
    one_of,
    open_unit_number,
    positive_int,
    positive_number,
    seed_number,
)
from .config import REGIME_CHOICES, CellConfig, cell_name, parse_rank
from .provenance import CODE_ROOT

REPO_ROOT = CODE_ROOT  # the checkout holding params/, notebooks/ and outputs/ (the package is installed editable)

TOP_REQUIRED = ("profile", "world", "matrix", "analysis")
TOP_OPTIONAL = ("cell", "build_world", "data", "cluster", "kl_bound", "baseline")
MATRIX_KEYS = ("regimes", "ranks", "full_ft", "seeds", "learning_rate")
MATRIX_OPTIONAL = ("steps",)
DATA_REQUIRED = ("prompt_template",)  # a data section exists to say how MATH rows become prompts

# What a learning-rate sweep chooses each arm's rate by: its final pass@1 (a study that reads every arm at its end)
# or its best pass@1 after step 0 (a study that stops each arm at its own best dev step).
RATE_CRITERIA = ("final", "best_step")
ANALYSIS_SCHEMA: dict[str, Checker] = {
    "equivalence_margin": positive_number,
    "confidence": open_unit_number,
    "compare_with": non_empty_string,  # another profile whose cells differ only in beta: the with/without-KL analysis
    "methods": label_mapping,  # method name -> profile, the first the baseline, the last writes the comparison
    "choose_rate_by": one_of(*RATE_CRITERIA),  # a learning-rate sweep's score of a rate (analysis/sweep.py)
    "replicates": non_empty_string,  # the study this one runs again elsewhere: verdicts side by side (replication.py)
}
ANALYSIS_DEFAULTS: dict[str, Any] = {"compare_with": None, "methods": None, "choose_rate_by": "final",
                                     "replicates": None}
# The capability baseline (paper Table 2): problems per sampling batch, each with max(ks) samples. Each batch draws
# from seed + its start, so the batch is part of the result; a paper-sized model needs fewer than the mini world.
BASELINE_SCHEMA: dict[str, Checker] = {"batch_size": positive_int}
BASELINE_DEFAULTS: dict[str, Any] = {"batch_size": 64}
COMPARISONS = ("compare_with", "methods")  # analysis keys that add a paper's comparison with other profiles
STUDY_SETTINGS = ("equivalence_margin", "confidence")  # the analysis keys a study's own analysis notebook reads


class ProfileError(ValueError):
    """A profile that cannot be used: the message names the file, the key and what was expected."""


@dataclass(frozen=True)
class Matrix:
    """The sweep: regimes x (ranks + FullFT) x learning rates x seeds.

    seeds[regime]: the seeds of a regime's every arm (a profile may give each regime its own, by power).
    learning_rate[regime][arm] holds the rates of an arm ("lora" or "full") in a regime: one in a study,
    several in a learning-rate sweep (then each rate is a cell of its own, its name tagged with the rate).
    steps[regime]: a regime's own number of steps where it differs from cell.steps (a regime may need longer
    to reach its plateau); a regime left out trains cell.steps.
    """

    regimes: tuple[str, ...]
    ranks: tuple[int, ...]
    full_ft: bool
    seeds: dict[str, tuple[int, ...]]
    learning_rate: dict[str, dict[str, tuple[float, ...]]]
    steps: dict[str, int] = field(default_factory=dict)

    @property
    def all_seeds(self) -> tuple[int, ...]:
        """Every seed some regime runs, ascending."""
        return tuple(sorted({seed for seeds in self.seeds.values() for seed in seeds}))

    @property
    def sweeps_rates(self) -> bool:
        return any(len(rates) > 1 for arms in self.learning_rate.values() for rates in arms.values())

    def learning_rate_of(self, regime: str, rank: int | None) -> float:
        """The learning rate of an arm in a regime (rank None: FullFT), when the profile gives exactly one."""
        if regime not in self.learning_rate:
            raise ValueError(f"regime {regime!r} is not one of the profile's matrix.regimes: {', '.join(self.regimes)}")
        arm = "full" if rank is None else "lora"
        rates = self.learning_rate[regime].get(arm)
        if not rates:
            raise ValueError(f"the profile has no matrix.learning_rate for {arm} in {regime}")
        if len(rates) > 1:
            raise ValueError(f"the profile sweeps {len(rates)} learning rates for {arm} in {regime}: "
                             "give the cell's own")
        return rates[0]


@dataclass(frozen=True)
class MatrixCell:
    """One training run of the matrix; rank None means full fine-tuning."""

    regime: str
    rank: int | None
    seed: int
    learning_rate: float
    tagged: bool = False  # in a learning-rate sweep: the rate is part of the name

    @property
    def name(self) -> str:
        """The cell's folder name, e.g. outcome-r4-s0, process-rfull-s2 or outcome-r1-lr0.0003-s100 (a sweep)."""
        return cell_name(self.regime, self.rank, self.seed, self.learning_rate if self.tagged else None)


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
    kl_bound: dict[str, Any] | None = None  # parameters of notebooks/kl_bound.py (Theorem 1 on Optdigits), if run
    baseline: dict[str, Any] = field(default_factory=lambda: dict(BASELINE_DEFAULTS))  # the capability baseline's

    def cells(self) -> list[MatrixCell]:
        """All cells: regimes outer, then ranks ascending then FullFT, then learning rates, then seeds."""
        ranks: list[int | None] = [*sorted(self.matrix.ranks), *([None] if self.matrix.full_ft else [])]
        tagged = self.matrix.sweeps_rates
        return [
            MatrixCell(regime, rank, seed, rate, tagged)
            for regime in self.matrix.regimes
            for rank in ranks
            for rate in self.matrix.learning_rate[regime]["full" if rank is None else "lora"]
            for seed in self.matrix.seeds[regime]
        ]

    def outputs_dir(self, root: Path) -> Path:
        """Where everything this profile's runs write lives under a project root."""
        return Path(root) / "outputs" / self.name

    def cells_dir(self, root: Path) -> Path:
        """Where the cells of this profile live under a project root."""
        return self.outputs_dir(root) / "cells"


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
    values = {**profile.cell, **profile.data, **profile.world}
    values["steps"] = profile.matrix.steps.get(regime, values["steps"])
    values.update(settings)
    cell = matrix_cell(profile, regime, rank, seed, learning_rate)
    for f in CellConfig.settings("world"):
        if values.get(f.name) is not None:
            values[f.name] = resolve_world_entry(values[f.name], root)
    values.update(
        regime=regime, rank=rank, seed=seed, profile=profile.name,
        learning_rate=cell.learning_rate,
        out_dir=str(resolve_path(out_dir or profile.cells_dir(root) / cell.name, root)),
    )
    return CellConfig(**values)


def matrix_cell(profile: Profile, regime: str, rank: int | None, seed: int, learning_rate: float | None) -> MatrixCell:
    """The matrix cell of an arm at this rate (None: the profile's rate for it), named as the profile names it."""
    rate = profile.matrix.learning_rate_of(regime, rank) if learning_rate is None else learning_rate
    return MatrixCell(regime, rank, seed, rate, profile.matrix.sweeps_rates)


def group_configs(
    profile: Profile, regime: str, ranks: Sequence[int | str | None], seed: int, *,
    learning_rate: float | Sequence[float] | None = None, cells_dir: str | Path | None = None, root: Path = REPO_ROOT,
    **settings: Any,
) -> list[CellConfig]:
    """The configs of arms trained together (one regime and seed), each in its folder under cells_dir
    (None: the profile's cells folder under root). learning_rate: one for every arm, one per arm, or None
    (each arm's rate in the profile); a learning-rate sweep's cell names carry the rate."""
    folder = profile.cells_dir(root) if cells_dir is None else resolve_path(cells_dir, root)
    if not ranks:
        raise ValueError("no rank given: a LoRA rank, 'full', or a list of them")
    rates = list(learning_rate) if isinstance(learning_rate, (list, tuple)) else [learning_rate] * len(ranks)
    if len(rates) != len(ranks):
        raise ValueError(f"{len(rates)} learning rates for {len(ranks)} ranks: give one, or one per rank")
    configs = []
    for rank, rate in zip(ranks, rates):
        cell = matrix_cell(profile, regime, parse_rank(rank), seed, rate)
        if any(Path(config.out_dir).name == cell.name for config in configs):
            raise ValueError(f"two arms would both write {cell.name}: give each arm its own rank (or, in a "
                             "learning-rate sweep, its own rate)")
        configs.append(cell_config(profile, regime, rank, seed, learning_rate=cell.learning_rate,
                                   out_dir=folder / cell.name, root=root, **settings))
    return configs


def is_local_path(value: str, root: Path) -> bool:
    """Whether a world entry names a local path (see the module docstring) rather than a hub id."""
    return looks_local(value) or Path(value).parts[:1] == ("outputs",) or (root / value).exists()


def resolve_path(path: str | Path, root: Path) -> Path:
    """A path made absolute against root (home expanded)."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else (Path(root) / path).resolve()


def resolve_world_entry(value: str, root: Path) -> str:
    """A local path made absolute against root; a hub id unchanged."""
    return str(resolve_path(value, root)) if is_local_path(value, root) else value


def find_profile(spec: str, root: Path = REPO_ROOT) -> Path:
    """The YAML file of a profile given by name (looked up in root/params) or by path (relative: to the current
    folder, else to root, as a notebook's other paths), as an absolute path: the cells and stage notebooks it is
    passed to run in root, not in the caller's folder."""
    if spec.endswith((".yaml", ".yml")) or "/" in spec:
        path = Path(spec)
        if not path.is_file() and not path.is_absolute() and (root / path).is_file():  # a kernel in notebooks/
            path = root / path
    else:
        path = root / "params" / f"{spec}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in (root / "params").glob("*.yaml"))) or "none"
        raise ProfileError(f"{path}: no such profile file (profiles in {root / 'params'}: {known})")
    return path.absolute()  # not resolve(): a profile file linked to another name is still named by its link


MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: plain YAML keeps the last silently, so a
    section appended to a profile would replace the one above it."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *anchor`: the safe loader merges it, a key given here overriding
                continue
            key = self.construct_object(key_node, deep=True)  # a list key is filled only when deep
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"found a key that is not a name: {key!r}",
                    key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"found the key {key!r} twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_profile(path: str | Path) -> Profile:
    """Read and fully validate a profile; every problem is a ProfileError naming file and key."""
    path = Path(path)
    try:
        with path.open() as stream:
            data = yaml.load(stream, Loader=_UniqueKeyLoader)
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
        kl_bound = data.get("kl_bound")
        if kl_bound is not None and not (isinstance(kl_bound, dict) and isinstance(kl_bound.get("out_dir"), str)):
            raise self.error("kl_bound", kl_bound, "a mapping of the Theorem-1 notebook's parameters with an out_dir")
        cell_checks, cell_defaults = _schema("cell")
        return self.cells(Profile(
            name=name,
            path=self.path,
            world=self.schema("world", data["world"], *_schema("world")),
            build_world=build_world,
            data=self.data(data["data"]) if "data" in data else {},
            cluster=self.cluster(data["cluster"]) if "cluster" in data else {},
            matrix=self.matrix(data["matrix"]),
            cell=cell_defaults | self.schema("cell", data.get("cell", {}), cell_checks, cell_defaults),
            analysis=ANALYSIS_DEFAULTS | self.schema("analysis", data["analysis"], ANALYSIS_SCHEMA, ANALYSIS_DEFAULTS),
            kl_bound=kl_bound,
            baseline=BASELINE_DEFAULTS | self.schema("baseline", data.get("baseline", {}), BASELINE_SCHEMA,
                                                     BASELINE_DEFAULTS),
        ))

    def cells(self, profile: Profile) -> Profile:
        """The profile, once every cell's settings hold together (the rules between settings, CellConfig's), so
        that a combination no cell can run stops the run before any work rather than failing every cell; and no two
        cells share a name (a folder), as two swept rates alike in the digits a name keeps would."""
        named: dict[str, MatrixCell] = {}
        for cell in profile.cells():
            if (twin := named.setdefault(cell.name, cell)) is not cell:
                raise ProfileError(f"{self.path}: matrix.learning_rate: the rates {twin.learning_rate!r} and "
                                   f"{cell.learning_rate!r} both name the cell {cell.name} (a name keeps 6 significant "
                                   "digits): give rates that differ within them")
            try:
                cell_config(profile, cell.regime, cell.rank, cell.seed, learning_rate=cell.learning_rate)
            except ValueError as exc:
                raise ProfileError(f"{self.path}: cell {cell.name}: {exc}") from None
        return profile

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
        if not isinstance(value, dict):
            raise self.error("cluster", value, "a mapping of submitit executor settings, timeout_min among them")
        for key in value:
            if not isinstance(key, str):
                raise ProfileError(f"{self.path}: cluster.{key}: expected a submitit executor setting's name (text)")
        data = self.mapping("cluster", value, ("timeout_min",), tuple(k for k in value if k != "timeout_min"))
        self.check("cluster.timeout_min", data["timeout_min"], positive_int)
        return dict(data)

    def matrix(self, value: Any) -> Matrix:
        """The validated matrix section; learning_rate.full is needed only when full_ft is true."""
        data = self.mapping("matrix", value, MATRIX_KEYS, MATRIX_OPTIONAL)
        full_ft = self.check("matrix.full_ft", data["full_ft"], boolean)
        regimes = self.unique_list("matrix.regimes", data["regimes"], one_of(*REGIME_CHOICES))
        rates = data["learning_rate"]
        if isinstance(rates, dict) and set(rates) & set(REGIME_CHOICES):  # one mapping of arms per regime
            self.mapping("matrix.learning_rate", rates, regimes)
            learning_rate = {r: self.arm_rates(f"matrix.learning_rate.{r}", rates[r], full_ft) for r in regimes}
        else:  # one mapping of arms for every regime
            arms = self.arm_rates("matrix.learning_rate", rates, full_ft)
            learning_rate = {regime: arms for regime in regimes}
        return Matrix(
            regimes=regimes,
            ranks=self.unique_list("matrix.ranks", data["ranks"], positive_int),
            full_ft=full_ft,
            seeds=self.seeds(data["seeds"], regimes),
            learning_rate=learning_rate,
            steps=self.regime_steps(data.get("steps", {}), regimes),
        )

    def regime_steps(self, value: Any, regimes: tuple[str, ...]) -> dict[str, int]:
        """The regimes that train their own number of steps: a mapping of some of the matrix's regimes."""
        self.mapping("matrix.steps", value, (), regimes)
        return {r: self.check(f"matrix.steps.{r}", steps, positive_int) for r, steps in value.items()}

    def seeds(self, value: Any, regimes: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
        """Each regime's seeds: one list for every regime, or a mapping of regime to its own list."""
        if isinstance(value, dict):
            self.mapping("matrix.seeds", value, regimes)
            return {r: self.unique_list(f"matrix.seeds.{r}", value[r], seed_number) for r in regimes}
        seeds = self.unique_list("matrix.seeds", value, seed_number)
        return {r: seeds for r in regimes}

    def arm_rates(self, key: str, value: Any, full_ft: bool) -> dict[str, tuple[float, ...]]:
        """{lora: rates, full: rates}: each a positive number or a list of them (a sweep)."""
        arms = self.mapping(key, value, ("lora", "full") if full_ft else ("lora",), () if full_ft else ("full",))
        return {arm: self.unique_list(f"{key}.{arm}", rate, positive_number) if isinstance(rate, list)
                else (self.check(f"{key}.{arm}", rate, positive_number),) for arm, rate in arms.items()}
