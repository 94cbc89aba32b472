"""One pattern for everything a run is composed of: strategies, benchmarks, models and quantization schemes.

A member is one module that registers a builder under its name together with the dataclass of its settings, plus
one config file `hdqt_cil/configs/<group>/<name>.yaml` that extends that dataclass (its schema, stored in Hydra's
ConfigStore as `schema/<group>/<name>`): the dataclass holds the defaults, types and allowed values, the YAML file
only what the member changes. Members are found by importing the modules of their packages (`load_members`), so
adding one touches no other file.
"""
import importlib
import pkgutil
from typing import Callable

from hydra.core.config_store import ConfigStore

MEMBER_PACKAGES = ("hdqt_cil.strategies", "hdqt_cil.benchmarks", "hdqt_cil.models", "hdqt_cil.quant")


class Registry:
    """Members of one config group: name → (builder, settings dataclass, extra facts about the member)."""

    def __init__(self, group: str):
        self.group = group
        self.members: dict[str, tuple[Callable, type, dict]] = {}

    def register(self, name: str, settings: type, **facts) -> Callable:
        """Decorator: register the builder under `name`, its schema in the ConfigStore."""
        def add(builder: Callable) -> Callable:
            self.members[name] = (builder, settings, facts)
            ConfigStore.instance().store(group=f"schema/{self.group}", name=name, node=settings)
            return builder
        return add

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.members))

    def _entry(self, name: str):
        if name not in self.members:
            load_members()
        if name not in self.members:
            raise ValueError(f"unknown {self.group} {name!r}; choose one of {', '.join(self.names())}")
        return self.members[name]

    def builder(self, name: str) -> Callable:
        return self._entry(name)[0]

    def settings(self, name: str) -> type:
        return self._entry(name)[1]

    def facts(self, name: str) -> dict:
        return self._entry(name)[2]


_loaded = False


def load_members() -> None:
    """Import every module of the member packages, so that each registers itself (once a process)."""
    global _loaded
    if _loaded:
        return
    for package_name in MEMBER_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.iter_modules(package.__path__, f"{package_name}."):
            importlib.import_module(module.name)
    _loaded = True
