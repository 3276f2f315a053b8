"""Package-level settings that reach the module which reads them.

The solver packages (``layer_ilp``, ``maxload``) re-export a few tunables and hooks, such as
``layer_ilp.QUICK_ATTEMPT_S`` or ``maxload._SMALL_LATTICE``, that tests and benchmarks set on the
package (``monkeypatch.setattr(layer_ilp, "QUICK_ATTEMPT_S", ...)``). A submodule reads its own
global, not the package's, so setting the name on the package alone would change nothing.
``forward_settings`` makes setting one of the listed names on the package set it in every submodule
that holds it too (the defining module and any that imported it), so the package stays the one
place to turn these knobs.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _SettingsPackage(types.ModuleType):
    """A package module whose listed attributes, when set, are also set in its submodules."""

    _forwarded_settings: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._forwarded_settings:
            prefix = self.__name__ + "."
            for mod_name, mod in list(sys.modules.items()):
                if mod is not None and mod_name.startswith(prefix) and name in vars(mod):
                    setattr(mod, name, value)
        super().__setattr__(name, value)


def forward_settings(package_name: str, names: tuple[str, ...]) -> None:
    """Make ``setattr(package, name, value)`` for each of ``names`` reach the submodules."""
    pkg = sys.modules[package_name]
    missing = [n for n in names if not hasattr(pkg, n)]
    if missing:
        raise AttributeError(f"{package_name} does not export {missing}")
    pkg.__class__ = _SettingsPackage
    vars(pkg)["_forwarded_settings"] = tuple(names)
