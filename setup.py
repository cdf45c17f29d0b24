"""Build hook only (metadata is in pyproject.toml): wheels carry the top-level template
directories ``job-templates/`` and ``slurm-conf/`` as package data under ``gpuhpc/_data/``,
where :func:`gpuhpc.fsutil.bundled_dir` finds them when gpuhpc is not run from a checkout."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLED = ("job-templates", "slurm-conf")


class BuildPyWithTemplates(build_py):
    def run(self):
        super().run()
        root = Path(__file__).resolve().parent
        for name in BUNDLED:
            dest = Path(self.build_lib) / "gpuhpc" / "_data" / name
            dest.mkdir(parents=True, exist_ok=True)
            for src in sorted((root / name).glob("*.j2")):
                shutil.copy2(src, dest / src.name)


setup(cmdclass={"build_py": BuildPyWithTemplates})
