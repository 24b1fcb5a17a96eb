"""Builds luxun's one compiled module; everything else is in setup.cfg.

``luxun._records`` checks and reads Kafka record batches in C (luxun/_records.c). It is
optional: where it cannot be built (no C compiler or Python headers) the install goes on
and luxun.records uses its pure-Python twin, about 100 times slower per record.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("luxun._records", ["luxun/_records.c"], optional=True, extra_compile_args=["-O2"])])
