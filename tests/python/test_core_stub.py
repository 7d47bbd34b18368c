"""python/asyncckpt/_core.pyi says what the pybind11 module has, no more and no less: every
name, and every function's parameters, defaults and types as pybind11 states them in its
docstrings (normalised: `int` for its SupportsInt | SupportsIndex, `float` likewise)."""

import ast
import re

import numpy as np
import pytest

import asyncckpt
from asyncckpt import _core
from conftest import SOURCE_DIR

STUB = ast.parse((SOURCE_DIR / "python" / "asyncckpt" / "_core.pyi").read_text())


def _stub_only_names():
    """The aliases and TypedDicts the stub adds for annotations (absent from the module)."""
    names = {}
    for node in STUB.body:
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.annotation) == "TypeAlias":
            names[node.target.id] = ast.unparse(node.value)
        elif isinstance(node, ast.ClassDef) and "TypedDict" in map(ast.unparse, node.bases):
            names[node.name] = "dict"
    return names


STUB_ONLY = _stub_only_names()


def _stub_type(annotation):
    text = ast.unparse(annotation)
    for name, meaning in STUB_ONLY.items():
        text = re.sub(rf"\b{name}\b", meaning, text)
    return text


def _runtime_type(text):
    text = text.replace("typing.SupportsInt | typing.SupportsIndex", "int")
    text = text.replace("typing.SupportsFloat | typing.SupportsIndex", "float")
    for module in ("collections.abc.", "typing.", "asyncckpt._core."):
        text = text.replace(module, "")
    return text


def _same_type(stub, runtime):
    # pybind11 states a py::list, py::dict or py::function without its items or signature: the
    # stub may say more.
    if runtime in ("list", "dict", "Callable"):
        return stub == runtime or stub.startswith(runtime + "[")
    return stub == runtime


def _signature(function, is_method):
    """[(name, type, default)] and the result type of a stub or runtime function node."""
    args = function.args.args[1:] if is_method else function.args.args
    defaults = [None] * (len(args) - len(function.args.defaults)) + [
        ast.unparse(d) for d in function.args.defaults]
    return [(a.arg, a.annotation, d) for a, d in zip(args, defaults)], function.returns


def _runtime_function(obj, name):
    """pybind11's signature line of `obj` as a parsed function, or None when it has none."""
    line = (obj.__doc__ or "").strip().splitlines()[:1]
    if not line or not re.match(rf"{re.escape(name)}\(|\(", line[0]):
        return None
    source = line[0] if line[0].startswith(name) else name + line[0]
    return ast.parse(f"def {source}: ...").body[0]


def _check_function(stub, runtime_obj, is_method, where):
    runtime = _runtime_function(runtime_obj, stub.name)
    assert runtime is not None, f"{where}: the module has no pybind11 signature for it"
    stub_params, stub_result = _signature(stub, is_method)
    runtime_params, runtime_result = _signature(runtime, is_method)
    assert [p[0] for p in stub_params] == [p[0] for p in runtime_params], where
    for (name, stub_type, stub_default), (_, runtime_type, runtime_default) in zip(
            stub_params, runtime_params):
        assert stub_default == runtime_default, f"{where}({name}): default"
        assert _same_type(_stub_type(stub_type), _runtime_type(ast.unparse(runtime_type))), \
            f"{where}({name}): {ast.unparse(stub_type)} vs {ast.unparse(runtime_type)}"
    assert _same_type(_stub_type(stub_result), _runtime_type(ast.unparse(runtime_result))), \
        f"{where}: result {ast.unparse(stub_result)} vs {ast.unparse(runtime_result)}"


def _stub_definitions():
    return {node.name if not isinstance(node, ast.AnnAssign) else node.target.id: node
            for node in STUB.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AnnAssign))}


def test_the_stub_and_the_module_name_the_same_things():
    stub = set(_stub_definitions()) - set(STUB_ONLY)
    runtime = {name for name in vars(_core) if not name.startswith("__")}
    assert stub == runtime
    assert not set(STUB_ONLY) & runtime


@pytest.mark.parametrize("name", sorted(set(_stub_definitions()) - set(STUB_ONLY)))
def test_a_stub_definition_matches_the_module(name):
    node = _stub_definitions()[name]
    runtime = getattr(_core, name)
    if isinstance(node, ast.AnnAssign):
        assert type(runtime).__name__ == ast.unparse(node.annotation)
    elif isinstance(node, ast.FunctionDef):
        _check_function(node, runtime, False, name)
    elif runtime is _core.CheckpointError:
        assert [ast.unparse(base) for base in node.bases] == ["RuntimeError"]
        assert issubclass(runtime, RuntimeError)
    else:
        methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        attributes = {n.target.id: n.annotation for n in node.body
                      if isinstance(n, ast.AnnAssign)}
        bound = {n for n, v in vars(runtime).items()
                 if not n.startswith("_") or _runtime_function(v, n) is not None}
        assert set(methods) | set(attributes) == bound, name
        for attribute_name, annotation in attributes.items():
            attribute = vars(runtime)[attribute_name]
            where = f"{name}.{attribute_name}"
            assert isinstance(attribute, property) and attribute.fset is not None, where
            getter = _runtime_function(attribute.fget, attribute_name)
            assert getter is not None, f"{where}: the module has no pybind11 signature for it"
            assert _same_type(_stub_type(annotation),
                              _runtime_type(ast.unparse(getter.returns))), \
                f"{where}: {ast.unparse(annotation)} vs {ast.unparse(getter.returns)}"
        for method, stub in methods.items():
            attribute = vars(runtime)[method]
            if isinstance(attribute, property):
                assert [ast.unparse(d) for d in stub.decorator_list] == ["property"]
                attribute = attribute.fget
            _check_function(stub, attribute, True, f"{name}.{method}")


def _typed_dict_keys(name):
    node = _stub_definitions()[name]
    return {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)}


def test_the_totals_hold_the_keys_the_stub_gives_them(ckpt_dir):
    with asyncckpt.CheckpointManager(ckpt_dir) as manager:
        manager.save(1, {"w": np.ones(4)})
        manager.wait_until_finished()
        totals = manager._core.totals()
    assert set(totals) == _typed_dict_keys("TotalsDict")
    assert set(totals["saves"][0]) == _typed_dict_keys("SaveStatsDict")
