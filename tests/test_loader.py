"""Tests for ``nan_hunter.project.loader``: discovery of the model, batch and loss, and its
errors."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from nan_hunter.errors import LoadError, UserCodeError
from nan_hunter.project.loader import Names, Target, load_target

MODEL_SOURCE = """\
import torch


def build_model():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 3)


def sample_batch():
    return torch.ones(4, 2)


def loss_fn(output, batch):
    return output.sum()
"""


@pytest.fixture(autouse=True)
def _forget_user_modules(tmp_path: Path) -> Iterator[None]:
    """User modules imported from tmp_path (and their siblings) must not leak into other tests."""
    before = set(sys.modules)
    yield
    root = str(tmp_path.resolve())
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None)
        from_tmp = file is not None and str(Path(file).resolve()).startswith(root)
        if from_tmp or name.startswith(("nhpkg_", "nh_sibling_")):
            del sys.modules[name]


def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def _line_of(path: Path, needle: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    hits = [i for i, line in enumerate(lines, start=1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def _model_file(tmp_path: Path, batch_expr: str = "torch.ones(4, 2)") -> Path:
    return _write(
        tmp_path,
        "model.py",
        MODEL_SOURCE.replace("return torch.ones(4, 2)", f"return {batch_expr}"),
    )


# -- happy paths ------------------------------------------------------------------------------


def test_load_target_from_file_path(tmp_path: Path) -> None:
    path = _model_file(tmp_path)
    target = load_target(str(path))
    assert isinstance(target, Target)
    assert isinstance(target.model, torch.nn.Linear)
    assert (target.model.in_features, target.model.out_features) == (2, 3)
    assert target.file == path.resolve()
    assert len(target.batch.args) == 1
    assert torch.equal(target.batch.args[0], torch.ones(4, 2))
    assert target.batch.kwargs == {}
    assert torch.equal(target.batch.raw, torch.ones(4, 2))
    assert target.loss_fn is not None
    assert target.loss_fn.__name__ == "loss_fn"
    assert float(target.loss_fn(torch.full((2, 2), 1.5), None)) == 6.0
    assert target.module_name in sys.modules
    assert sys.modules[target.module_name].__file__ == str(path.resolve())


def test_load_target_without_loss_fn(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "noloss.py",
        """\
        import torch
        def build_model():
            return torch.nn.ReLU()
        def sample_batch():
            return torch.zeros(1)
        """,
    )
    target = load_target(str(path))
    assert target.loss_fn is None
    assert isinstance(target.model, torch.nn.ReLU)


def test_renamed_functions(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "renamed.py",
        """\
        import torch
        def make_net():
            return torch.nn.Tanh()
        def inputs():
            return torch.full((2,), 7.0)
        def my_loss(output, batch):
            return output.mean()
        def build_model():
            raise AssertionError("the default name must not be used")
        """,
    )
    names = Names(model_fn="make_net", batch_fn="inputs", loss_fn="my_loss")
    target = load_target(str(path), names)
    assert isinstance(target.model, torch.nn.Tanh)
    assert torch.equal(target.batch.args[0], torch.full((2,), 7.0))
    assert target.loss_fn is not None
    assert target.loss_fn.__name__ == "my_loss"


def test_batch_tensor_becomes_one_positional_arg(tmp_path: Path) -> None:
    target = load_target(str(_model_file(tmp_path, "torch.arange(3.0)")))
    assert len(target.batch.args) == 1
    assert target.batch.args[0].tolist() == [0.0, 1.0, 2.0]
    assert target.batch.kwargs == {}


def test_batch_tuple_becomes_positional_args(tmp_path: Path) -> None:
    target = load_target(str(_model_file(tmp_path, "(torch.zeros(2), torch.ones(3), 5)")))
    assert len(target.batch.args) == 3
    assert target.batch.args[0].tolist() == [0.0, 0.0]
    assert target.batch.args[1].tolist() == [1.0, 1.0, 1.0]
    assert target.batch.args[2] == 5
    assert target.batch.kwargs == {}
    assert isinstance(target.batch.raw, tuple)


def test_batch_list_becomes_positional_args(tmp_path: Path) -> None:
    target = load_target(str(_model_file(tmp_path, "[torch.zeros(1), torch.ones(1)]")))
    assert isinstance(target.batch.args, tuple)
    assert [t.item() for t in target.batch.args] == [0.0, 1.0]
    assert isinstance(target.batch.raw, list)


def test_batch_dict_becomes_kwargs(tmp_path: Path) -> None:
    target = load_target(
        str(_model_file(tmp_path, "{'x': torch.ones(2), 'mask': torch.zeros(2, dtype=torch.bool)}"))
    )
    assert target.batch.args == ()
    assert sorted(target.batch.kwargs) == ["mask", "x"]
    assert target.batch.kwargs["x"].tolist() == [1.0, 1.0]
    assert target.batch.kwargs["mask"].dtype == torch.bool
    assert target.batch.raw is not target.batch.kwargs  # a copy, not the user's dict


def test_batch_dict_with_non_string_key_is_refused(tmp_path: Path) -> None:
    path = _model_file(tmp_path, "{0: torch.ones(2)}")
    with pytest.raises(LoadError, match=r"sample_batch\(\) returned a dict whose keys are not all "
                                        r"strings: 0"):
        load_target(str(path))


def test_import_by_dotted_module_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "nhpkg_dotted/__init__.py", "")
    path = _write(tmp_path, "nhpkg_dotted/net.py", MODEL_SOURCE)
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    target = load_target("nhpkg_dotted.net")
    assert sys.path == before
    assert target.module_name == "nhpkg_dotted.net"
    assert target.file == path.resolve()
    assert isinstance(target.model, torch.nn.Linear)
    assert torch.equal(target.batch.args[0], torch.ones(4, 2))


def test_dotted_name_of_missing_module_in_existing_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, "nhpkg_half/__init__.py", "")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError, match=r"^model file or module not found: nhpkg_half\.absent$"):
        load_target("nhpkg_half.absent")


def test_dotted_name_with_missing_top_package_is_load_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError, match=r"^model file or module not found: nhpkg_nowhere\.net$"):
        load_target("nhpkg_nowhere.net")


def test_model_folder_is_on_sys_path_during_import_only(tmp_path: Path) -> None:
    folder = tmp_path / "proj"
    _write(folder, "nh_sibling_helper.py", "WIDTH = 5\n")
    path = _write(
        folder,
        "model.py",
        """\
        import sys
        import torch
        import nh_sibling_helper

        PATH_AT_IMPORT = list(sys.path)

        def build_model():
            return torch.nn.Linear(nh_sibling_helper.WIDTH, 1)

        def sample_batch():
            return torch.ones(1, nh_sibling_helper.WIDTH)
        """,
    )
    before = list(sys.path)
    target = load_target(str(path))
    assert sys.path == before
    assert str(folder.resolve()) not in sys.path
    assert target.model.in_features == 5
    user_module = sys.modules[target.module_name]
    assert user_module.PATH_AT_IMPORT[0] == str(folder.resolve())
    assert user_module.PATH_AT_IMPORT[1:] == before


def test_sys_path_is_restored_when_import_fails(tmp_path: Path) -> None:
    source = "import sys\nsys.path.append('/nowhere')\nraise ValueError('x')\n"
    path = _write(tmp_path, "boom.py", source)
    before = list(sys.path)
    with pytest.raises(UserCodeError):
        load_target(str(path))
    assert sys.path == before


# -- loading errors ---------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(LoadError, match=r"^model file not found: ") as info:
        load_target(str(missing))
    assert str(missing) in str(info.value)


def test_directory_given_as_file(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r" is a folder, not a model file: name the \.py file"):
        load_target(str(tmp_path))


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "broken.py",
        """\
        import torch

        def build_model(:
            return torch.nn.Linear(1, 1)
        """,
    )
    with pytest.raises(LoadError) as info:
        load_target(str(path))
    message = str(info.value)
    assert message.startswith(f"syntax error in {path.resolve()}:3: ")
    assert isinstance(info.value.__cause__, SyntaxError)


def test_missing_build_model(tmp_path: Path) -> None:
    source = "import torch\ndef sample_batch():\n    return torch.ones(1)\n"
    path = _write(tmp_path, "nobuild.py", source)
    with pytest.raises(LoadError) as info:
        load_target(str(path))
    assert str(info.value) == (
        "nobuild.py defines no build_model(); define it or name another function with --model-fn"
    )


def test_missing_sample_batch(tmp_path: Path) -> None:
    source = "import torch\ndef build_model():\n    return torch.nn.ReLU()\n"
    path = _write(tmp_path, "nobatch.py", source)
    with pytest.raises(LoadError) as info:
        load_target(str(path))
    assert str(info.value) == (
        "nobatch.py defines no sample_batch(); define it or name another function with --batch-fn"
    )


def test_missing_renamed_function_suggests_the_right_flag(tmp_path: Path) -> None:
    # The flag must not be guessed from the function's name ("make_net" has no "model").
    path = _model_file(tmp_path)
    with pytest.raises(LoadError) as info:
        load_target(str(path), Names(model_fn="make_net"))
    assert str(info.value) == (
        "model.py defines no make_net(); define it or name another function with --model-fn"
    )
    with pytest.raises(LoadError) as info:
        load_target(str(path), Names(batch_fn="model_inputs"))
    assert str(info.value) == (
        "model.py defines no model_inputs(); define it or name another function with --batch-fn"
    )


def test_build_model_returning_non_module(tmp_path: Path) -> None:
    path = _write(tmp_path, "notmod.py", "def build_model():\n    return [1, 2]\n")
    with pytest.raises(LoadError) as info:
        load_target(str(path))
    assert str(info.value) == "build_model() in notmod.py must return a torch.nn.Module, got list"


def test_sample_batch_returning_int(tmp_path: Path) -> None:
    path = _model_file(tmp_path, "3")
    with pytest.raises(LoadError) as info:
        load_target(str(path))
    assert str(info.value) == (
        "sample_batch() must return a Tensor, a tuple of Tensors or a dict, got int"
    )


def test_non_callable_build_model_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "three.py", "build_model = 3\n")
    with pytest.raises(LoadError) as info:
        load_target(str(path))
    # The user's file, not the internal module name (_nan_hunter_user_three_xxxxxx).
    assert str(info.value) == "build_model in three.py is a int, not a function"


def test_exception_while_importing_is_user_code_error(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "raises_on_import.py",
        """\
        import torch

        SCALE = {"a": 1}["b"]
        """,
    )
    with pytest.raises(UserCodeError) as info:
        load_target(str(path))
    line = _line_of(path, 'SCALE = {"a": 1}["b"]')
    assert info.value.user_frame == f"{path.resolve()}:{line}"
    message = str(info.value)
    assert message.startswith(f"KeyError while importing {path}: 'b'")
    assert message.endswith(f"(at {path.resolve()}:{line})")
    assert isinstance(info.value.__cause__, KeyError)


def test_exception_inside_build_model_is_user_code_error(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "raises_in_build.py",
        """\
        import torch

        def _helper():
            raise ValueError("bad width\\nsecond line")

        def build_model():
            return _helper()

        def sample_batch():
            return torch.ones(1)
        """,
    )
    with pytest.raises(UserCodeError) as info:
        load_target(str(path))
    line = _line_of(path, 'raise ValueError("bad width')
    assert info.value.user_frame == f"{path.resolve()}:{line}"
    assert str(info.value) == (
        f"ValueError while calling build_model(): bad width (at {path.resolve()}:{line})"
    )


def test_exception_inside_sample_batch_is_user_code_error(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "raises_in_batch.py",
        """\
        import torch

        def build_model():
            return torch.nn.ReLU()

        def sample_batch():
            return 1 / 0
        """,
    )
    with pytest.raises(UserCodeError, match=r"^ZeroDivisionError while calling sample_batch\(\)"):
        load_target(str(path))


def test_exception_raised_in_torch_points_at_user_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "neg_width.py",
        """\
        import torch

        def build_model():
            return torch.nn.Linear(-1, 2)

        def sample_batch():
            return torch.ones(1)
        """,
    )
    with pytest.raises(UserCodeError) as info:
        load_target(str(path))
    line = _line_of(path, "torch.nn.Linear(-1, 2)")
    assert info.value.user_frame == f"{path.resolve()}:{line}"


# -- weights ----------------------------------------------------------------------------------


def test_weights_state_dict_loads(tmp_path: Path) -> None:
    path = _model_file(tmp_path)
    weights = tmp_path / "w.pt"
    state = {
        "weight": torch.arange(6.0).reshape(3, 2),
        "bias": torch.tensor([-1.0, 0.5, 2.0]),
    }
    torch.save(state, weights)
    target = load_target(str(path), weights=weights)
    assert torch.equal(target.model.weight.detach(), state["weight"])
    assert torch.equal(target.model.bias.detach(), state["bias"])


def test_weights_that_do_not_fit(tmp_path: Path) -> None:
    path = _model_file(tmp_path)
    weights = tmp_path / "wrong.pt"
    torch.save({"weight": torch.ones(5, 5)}, weights)
    with pytest.raises(LoadError) as info:
        load_target(str(path), weights=weights)
    message = str(info.value)
    assert message.startswith(f"weights file {weights} does not fit the model: ")
    assert "Missing key(s) in state_dict: \"bias\"" in message
    assert "size mismatch for weight" in message


def test_weights_file_holding_a_tensor(tmp_path: Path) -> None:
    path = _model_file(tmp_path)
    weights = tmp_path / "tensor.pt"
    torch.save(torch.ones(2), weights)
    with pytest.raises(LoadError) as info:
        load_target(str(path), weights=weights)
    assert str(info.value) == f"weights file {weights} holds a Tensor, not a state_dict"


def test_missing_weights_file(tmp_path: Path) -> None:
    path = _model_file(tmp_path)
    weights = tmp_path / "absent.pt"
    with pytest.raises(LoadError) as info:
        load_target(str(path), weights=weights)
    assert str(info.value) == f"weights file not found: {weights}"


class _Pickled:
    """A class a weights_only load must refuse to rebuild."""

    def __init__(self) -> None:
        self.value = 1


def test_pickled_object_is_refused(tmp_path: Path) -> None:
    path = _model_file(tmp_path)
    weights = tmp_path / "evil.pt"
    torch.save({"weight": _Pickled()}, weights)
    with pytest.raises(LoadError) as info:
        load_target(str(path), weights=weights)
    message = str(info.value)
    assert message.startswith(f"cannot load weights file {weights} safely (weights_only=True): ")
    assert isinstance(info.value.__cause__, Exception)


# -- batch files ------------------------------------------------------------------------------


def test_batch_file_tensor(tmp_path: Path) -> None:
    path = _model_file(tmp_path, "None")  # sample_batch must not be used
    batch = tmp_path / "batch.pt"
    torch.save(torch.tensor([[1.0, -2.0]]), batch)
    target = load_target(str(path), batch_file=batch)
    assert len(target.batch.args) == 1
    assert target.batch.args[0].tolist() == [[1.0, -2.0]]
    assert target.batch.kwargs == {}


def test_batch_file_tuple(tmp_path: Path) -> None:
    path = _model_file(tmp_path, "None")
    batch = tmp_path / "batch.pt"
    torch.save((torch.zeros(1), torch.full((2,), 3.0)), batch)
    target = load_target(str(path), batch_file=batch)
    assert [t.tolist() for t in target.batch.args] == [[0.0], [3.0, 3.0]]
    assert target.batch.kwargs == {}


def test_batch_file_dict(tmp_path: Path) -> None:
    path = _model_file(tmp_path, "None")
    batch = tmp_path / "batch.pt"
    torch.save({"input_ids": torch.tensor([1, 2, 3]), "scale": torch.tensor(0.5)}, batch)
    target = load_target(str(path), batch_file=batch)
    assert target.batch.args == ()
    assert target.batch.kwargs["input_ids"].tolist() == [1, 2, 3]
    assert target.batch.kwargs["scale"].item() == 0.5


def test_batch_file_with_wrong_content_names_the_file(tmp_path: Path) -> None:
    path = _model_file(tmp_path, "None")
    batch = tmp_path / "batch.pt"
    torch.save(7, batch)
    with pytest.raises(LoadError) as info:
        load_target(str(path), batch_file=batch)
    assert str(info.value) == (
        f"{batch} must return a Tensor, a tuple of Tensors or a dict, got int"
    )


def test_missing_batch_file(tmp_path: Path) -> None:
    path = _model_file(tmp_path)
    batch = tmp_path / "absent.pt"
    with pytest.raises(LoadError) as info:
        load_target(str(path), batch_file=batch)
    assert str(info.value) == f"batch file not found: {batch}"


def test_safetensors_weights_and_batch(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = _model_file(tmp_path, "None")
    weights = tmp_path / "w.safetensors"
    state = {"weight": torch.full((3, 2), 0.25), "bias": torch.tensor([1.0, 2.0, 3.0])}
    safetensors_torch.save_file(state, str(weights))
    batch = tmp_path / "b.safetensors"
    safetensors_torch.save_file({"x": torch.ones(1, 2)}, str(batch))
    target = load_target(str(path), weights=weights, batch_file=batch)
    assert torch.equal(target.model.weight.detach(), state["weight"])
    assert torch.equal(target.model.bias.detach(), state["bias"])
    assert target.batch.kwargs["x"].tolist() == [[1.0, 1.0]]


def test_corrupt_safetensors_file(tmp_path: Path) -> None:
    pytest.importorskip("safetensors.torch")
    path = _model_file(tmp_path)
    weights = tmp_path / "bad.safetensors"
    weights.write_bytes(b"not a safetensors file")
    with pytest.raises(LoadError, match=r"^cannot read weights file "):
        load_target(str(path), weights=weights)


def test_import_writes_no_bytecode_next_to_the_users_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    (tmp_path / "helper_mod_nb.py").write_text(
        "import torch\n\ndef make():\n    return torch.nn.Linear(4, 2)\n"
    )
    (tmp_path / "model_nb.py").write_text(
        "import torch\nfrom helper_mod_nb import make\n\n"
        "def build_model():\n    return make()\n\n"
        "def sample_batch():\n    return torch.ones(2, 4)\n"
    )
    try:
        load_target(str(tmp_path / "model_nb.py"))
    finally:
        sys.modules.pop("helper_mod_nb", None)
    assert not (tmp_path / "__pycache__").exists()
    assert sys.dont_write_bytecode is False
