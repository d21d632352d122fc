"""taichi.lang.util.has_pytorch, has_paddle."""
import importlib.util


def has_pytorch():
    return importlib.util.find_spec("torch") is not None


def has_paddle():
    return importlib.util.find_spec("paddle") is not None
