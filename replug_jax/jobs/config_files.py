"""Experiment configs are Python files loaded by path; this lets one build on another."""
from __future__ import annotations

import importlib.util
import os


def sibling_config(this_file: str, name: str):
    """get_config() of the config file `name` in the same folder as `this_file`."""
    path = os.path.join(os.path.dirname(os.path.abspath(this_file)), name)
    spec = importlib.util.spec_from_file_location(f"config_{os.path.splitext(name)[0]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def set_from_text(config, item: str) -> None:
    """A "KEY=VALUE" setting (an experiment script's --set) written into `config`, VALUE read as the key's type."""
    key, value = item.split("=", 1)
    config[key] = config.get_type(key)(value) if not isinstance(config[key], bool) else value == "True"
