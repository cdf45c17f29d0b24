"""The function the pipeline tests' jobs run (a module of its own with no imports, so a job
unpickles it with nothing but this directory on its PYTHONPATH)."""


def square(x: int) -> int:
    return x * x
