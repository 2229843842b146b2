"""Where vprl lives: its package folder, the folder that holds it, and the source checkout around it
when there is one. Standard library only: the sandbox's supervisor imports it before anything else."""

from __future__ import annotations

from pathlib import Path

# The `vprl/` folder itself: files shipped with the package (tool stacks, prompts) are found from here.
PACKAGE = Path(__file__).resolve().parent

# The folder on `sys.path` that holds `vprl/`: a checkout's root in an editable install, site-packages
# (or a `pip install --target` folder) otherwise. A process started without our `sys.path` imports
# vprl from here.
IMPORT_ROOT = PACKAGE.parent


def _checkout(root: Path) -> Path | None:
    # pyproject.toml alone could be a user's project that vendors vprl; configs/ next to it is ours.
    return root if (root / "pyproject.toml").is_file() and (root / "configs").is_dir() else None


# The source checkout vprl runs from (recipes in configs/, tests/, bench/); None for a non-editable
# install, which carries the package alone.
CHECKOUT: Path | None = _checkout(IMPORT_ROOT)


def checkout_file(relative: str | Path) -> Path:
    """`relative` inside the source checkout; fails in one line where vprl is installed without one."""
    if CHECKOUT is None:
        raise FileNotFoundError(
            f"{relative} is only in a source checkout of vprl (this vprl is installed at {PACKAGE}); "
            "give the path of your own copy"
        )
    return CHECKOUT / relative
