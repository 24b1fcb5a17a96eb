"""Builds luxun's compiled modules; everything else is in setup.cfg.

``luxun._records`` checks and reads Kafka record batches in C (luxun/_records.c). It is
optional: where it cannot be built (no C compiler or Python headers) the install goes on
and luxun.records uses its pure-Python twin, about 100 times slower per record.

``luxun._netloop`` serves the Thrift door's small sync calls (produce, one-item consume)
without the interpreter's loop, busy polling included (luxun/_netloop.c). Also optional: without it the
Python loop of luxun.thrift.server serves them, as it serves every other call.

``bigarray._fastpath`` holds the inlined paths of BigArray.append, BigArray.get and
FanoutQueue.dequeue in C (bigarray/_fastpath.c), which the compiled loop calls to append a
produce's item from its receive buffer and to read a one-item consume's item. Optional too:
without it the compiled loop calls the handler for those calls.
"""

from setuptools import Extension, setup


def optional(name: str, depends: tuple[str, ...] = ()) -> Extension:
    """A compiled module built from the C file of the same path, skipped where it cannot be."""
    source = name.replace(".", "/") + ".c"
    return Extension(name, [source], depends=list(depends), optional=True, extra_compile_args=["-O2"])


setup(
    ext_modules=[
        optional("luxun._records"),
        optional("luxun._netloop", depends=("bigarray/_fastpath.h",)),
        optional("bigarray._fastpath", depends=("bigarray/_fastpath.h",)),
    ]
)
