"""taichi.lang.util.has_pytorch."""


def has_pytorch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
