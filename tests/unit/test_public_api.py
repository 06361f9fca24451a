"""The public API is exactly zmesh.__all__: sorted, complete, and nothing stray."""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re
import types

import pytest

import zmesh
import zmesh.errors

# Modules whose public classes and functions users write against. Public modules added
# later (not underscored, not a subpackage) are picked up too.
NAMED_PUBLIC_MODULES = [
    "zmesh.node",
    "zmesh.subscription",
    "zmesh.config",
    "zmesh.errors",
    "zmesh._receipt",
]
# Namespaces of their own, outside __all__ by design (DESIGN.md: "plus zmesh.aio, zmesh.spark").
OWN_NAMESPACES = {"aio", "spark", "cli"}
# Public-looking helpers that are internal plumbing, not API users need.
INTERNAL_HELPERS = {
    "zmesh.config.check_name",
    "zmesh.config.parse_seed",
    "zmesh.config.check_delay",
    "zmesh.config.checked_headers",
    "zmesh.config.payload_bytes",
    "zmesh.config.utf8",
    "zmesh.config.check_max_messages",
    "zmesh.config.check_fields",
    "zmesh.config.build_config",
    "zmesh.config.int_in",
    "zmesh.config.check_topic_config",
    "zmesh._receipt.Stage",
    "zmesh._receipt.Publisher",
    "zmesh._receipt.Signal",
    "zmesh.subscription.Origin",
}


def public_modules() -> list[types.ModuleType]:
    names = set(NAMED_PUBLIC_MODULES)
    for info in pkgutil.iter_modules(zmesh.__path__):
        if not info.name.startswith("_") and not info.ispkg and info.name not in OWN_NAMESPACES:
            names.add(f"zmesh.{info.name}")
    return [importlib.import_module(n) for n in sorted(names)]


def defined_here(module: types.ModuleType) -> dict[str, object]:
    """Public classes and functions defined in ``module`` (not imported into it)."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    }


def test_all_is_sorted_and_unique() -> None:
    assert list(zmesh.__all__) == sorted(zmesh.__all__)
    assert len(set(zmesh.__all__)) == len(zmesh.__all__)


def test_every_name_in_all_exists() -> None:
    missing = [name for name in zmesh.__all__ if not hasattr(zmesh, name)]
    assert missing == []


def test_all_holds_no_private_names() -> None:
    assert [name for name in zmesh.__all__ if name.startswith("_")] == []


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from zmesh import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(zmesh.__all__)


def test_the_named_public_modules_are_covered() -> None:
    covered = {m.__name__ for m in public_modules()}
    assert set(NAMED_PUBLIC_MODULES) <= covered
    assert "zmesh.aio" not in covered


@pytest.mark.parametrize("module", public_modules(), ids=lambda m: m.__name__)
def test_public_definitions_are_in_all(module: types.ModuleType) -> None:
    missing = [
        f"{module.__name__}.{name}"
        for name in defined_here(module)
        if name not in zmesh.__all__ and f"{module.__name__}.{name}" not in INTERNAL_HELPERS
    ]
    assert missing == [], f"public but not exported from zmesh: {missing}"


@pytest.mark.parametrize("module", public_modules(), ids=lambda m: m.__name__)
def test_module_all_is_re_exported_as_the_same_objects(module: types.ModuleType) -> None:
    module_all = getattr(module, "__all__", None)
    assert module_all is not None, f"{module.__name__} has no __all__"
    for name in module_all:
        assert name in zmesh.__all__, f"{module.__name__}.{name} is not in zmesh.__all__"
        assert getattr(zmesh, name) is getattr(module, name)


def test_nothing_public_in_the_package_namespace_outside_all() -> None:
    stray = [
        name
        for name, obj in vars(zmesh).items()
        if not name.startswith("_")
        and not isinstance(obj, types.ModuleType)
        and name not in zmesh.__all__
    ]
    assert stray == []


def test_internal_helpers_still_exist() -> None:
    # Keeps INTERNAL_HELPERS honest: a stale entry would hide nothing and mislead.
    for dotted in INTERNAL_HELPERS:
        module, _, name = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), name), dotted


@pytest.mark.parametrize("name", zmesh.__all__)
def test_exported_names_have_docstrings(name: str) -> None:
    obj = getattr(zmesh, name)
    assert inspect.getdoc(obj), f"zmesh.{name} has no docstring"


def test_expected_core_names_are_exported() -> None:
    for name in (
        "Node",
        "NodeConfig",
        "TopicConfig",
        "SubscriptionConfig",
        "Message",
        "Subscription",
        "Receipt",
        "MessageId",
        "ZMeshError",
        "ConfigError",
        "TimeoutError",
        "DecodeError",
    ):
        assert name in zmesh.__all__, name


# -- exceptions ---------------------------------------------------------------------------------


def error_classes() -> list[type[BaseException]]:
    return [
        obj
        for obj in vars(zmesh.errors).values()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == "zmesh.errors"
    ]


def test_errors_module_has_exceptions() -> None:
    assert len(error_classes()) >= 10


@pytest.mark.parametrize("cls", error_classes(), ids=lambda c: c.__name__)
def test_every_error_derives_from_zmesh_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, zmesh.ZMeshError)
    assert cls.__name__ in zmesh.__all__
    assert getattr(zmesh, cls.__name__) is cls


def test_zmesh_error_is_an_exception() -> None:
    assert issubclass(zmesh.ZMeshError, Exception)
    assert zmesh.ZMeshError.__module__ == "zmesh.errors"


def test_timeout_error_is_also_the_builtin() -> None:
    assert zmesh.TimeoutError is not builtins.TimeoutError
    assert issubclass(zmesh.TimeoutError, builtins.TimeoutError)
    assert issubclass(zmesh.TimeoutError, zmesh.ZMeshError)
    with pytest.raises(builtins.TimeoutError):
        raise zmesh.TimeoutError("waited too long")


@pytest.mark.parametrize("cls", [zmesh.ConfigError, zmesh.ArgumentError])
def test_argument_errors_are_value_errors(cls: type[Exception]) -> None:
    assert issubclass(cls, ValueError)


def test_store_full_is_a_store_error_with_numbers() -> None:
    err = zmesh.StoreFullError("/var/n1", 1 << 20)
    assert isinstance(err, zmesh.StoreError)
    assert err.map_size_bytes == 1 << 20
    assert err.path == "/var/n1"
    assert "1048576" in str(err) and "/var/n1" in str(err)
    assert "max_map_size_bytes" in str(err) and err.waited_s is None


def test_outbox_full_carries_its_numbers() -> None:
    err = zmesh.OutboxFullError(depth=10, limit=10, timeout_s=2.5)
    assert (err.depth, err.limit, err.timeout_s) == (10, 10, 2.5)
    assert "10" in str(err) and "2.5s" in str(err)


def test_data_dir_locked_names_the_path() -> None:
    err = zmesh.DataDirLockedError("/var/n1")
    assert err.path == "/var/n1" and "/var/n1" in str(err)


def test_error_tree_in_the_docstring_matches_the_classes() -> None:
    # Lines like "    ├── StoreError   ..." or "    │   └── StoreFullError ...".
    doc = zmesh.errors.__doc__ or ""
    row = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)")
    parents: dict[str, str] = {}
    stack: list[str] = ["ZMeshError"]
    for line in doc.splitlines():
        match = row.match(line.removeprefix("    "))
        if not match:
            continue
        depth = len(match["indent"]) // 4 + 1
        del stack[depth:]
        parents[match["name"]] = stack[-1]
        stack.append(match["name"])
    classes = {c.__name__: c for c in error_classes()}
    assert set(parents) | {"ZMeshError"} == set(classes)
    for name, parent in parents.items():
        assert classes[parent] in classes[name].__bases__, f"{name} should derive from {parent}"
