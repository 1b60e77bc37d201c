"""The package is declared in setup.cfg; this adds the one compiled part: the binlog rows walker
(airflow_provider_cdc/dialects/mysql/_rows.c), built from source at install with the machine's C
compiler. Without a compiler or Python's headers the install still succeeds, with a warning, and
MariaDB/MySQL capture uses its pure-Python reader (dialects/mysql/rows_walker.py)."""

import os
import shutil

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

    def copy_file(self, infile, outfile, *args, **kwargs):
        """The editable install copies the built extension beside its source, over the one a running
        process (a capture, a test) may have loaded: write it beside and rename it over (rewriting a
        loaded shared object in place can crash that process)."""
        if not (str(outfile).endswith(".so") and os.path.exists(outfile)) or self.dry_run:
            return super().copy_file(infile, outfile, *args, **kwargs)
        tmp = f"{outfile}.new"
        shutil.copyfile(infile, tmp)
        shutil.copymode(infile, tmp)
        os.replace(tmp, outfile)
        return outfile, 1

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
