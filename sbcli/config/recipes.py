"""Named recipes: the exact settings of a run, as TOML files in ``zoo/recipes/`` (or any path).

A recipe is a flat table of `sb train` options (``method = "sb"``, ``tasks = 10``, ``rho = 1.15``,
``phase_epochs = "200,200,200"``...); options given on the command line override it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from sbcli.errors import ConfigError

RECIPE_DIRS = (Path(__file__).resolve().parents[1] / "_zoo" / "recipes", Path(__file__).resolve().parents[2] / "zoo" / "recipes")


def list_recipes() -> list[str]:
    return sorted({p.stem for d in RECIPE_DIRS if d.is_dir() for p in d.glob("*.toml")})


def find_recipe(name: str, source: str | None) -> Path:
    """A recipe file by path, by ``<source>-<name>`` (e.g. cifar100-paper-10) or by plain name."""
    path = Path(name)
    if path.suffix == ".toml":
        if not path.is_file():
            raise ConfigError(f"Recipe file {name} does not exist; check the path.")
        return path
    for stem in ([f"{source}-{name}"] if source else []) + [name]:
        for folder in RECIPE_DIRS:
            if (folder / f"{stem}.toml").is_file():
                return folder / f"{stem}.toml"
    raise ConfigError(f"No recipe '{name}' for {source or 'this source'}; known recipes: {', '.join(list_recipes())}.")


def load_recipe(name: str, source: str | None) -> dict:
    """The options of a recipe, with ``phase_epochs`` and friends kept as written."""
    path = find_recipe(name, source)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"Recipe {path} is not valid TOML ({err}); fix the file.") from err
    data.pop("description", None)
    return {**data, "recipe_path": str(path)}
