"""Builds luxun's compiled modules; everything else is in setup.cfg.

``luxun._records`` checks and reads Kafka record batches in C (luxun/_records.c). It is
optional: where it cannot be built (no C compiler or Python headers) the install goes on
and luxun.records uses its pure-Python twin, about 100 times slower per record.

``luxun._netloop`` serves the Thrift door's small sync calls (produce, one-item consume)
without the interpreter's loop, busy polling included (luxun/_netloop.c). Also optional: without it the
Python loop of luxun.thrift.server serves them, as it serves every other call.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("luxun._records", ["luxun/_records.c"], optional=True, extra_compile_args=["-O2"]),
        Extension("luxun._netloop", ["luxun/_netloop.c"], optional=True, extra_compile_args=["-O2"]),
    ]
)
