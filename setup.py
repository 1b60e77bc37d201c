"""The package is declared in setup.cfg; this adds the one compiled part: the binlog rows walker
(airflow_provider_cdc/dialects/mysql/_rows.c), built from source at install with the machine's C
compiler. Without a compiler or Python's headers the install still succeeds, with a warning, and
MariaDB/MySQL capture uses its pure-Python reader (dialects/mysql/rows_walker.py)."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the extension cannot be built."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler at all: the pure-Python reader stays
            self._skipped(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - a compile error: the pure-Python reader stays
            self._skipped(exc)

    def _skipped(self, exc: Exception) -> None:
        self.warn(f"the compiled binlog rows walker was not built ({exc}); MariaDB/MySQL capture will use "
                  "the pure-Python reader. Install gcc and the Python headers (python3-dev) and reinstall")


setup(
    ext_modules=[
        Extension(
            "airflow_provider_cdc.dialects.mysql._rows",
            ["airflow_provider_cdc/dialects/mysql/_rows.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
