"""Build of the hybrid package and its Cython kernels (``cython_ext/``).

Kernels are compiled with -O3 and OpenMP so that ``prange`` loops run without
the GIL. ``pip install --no-build-isolation -e .`` (launch/setup.sh does it).
They are translated and compiled on every core at once: a set-up on a
16-core GPU host is paced by this build.
"""
import os
import platform
import shutil
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

HERE = Path(__file__).parent
KERNELS = sorted(p.stem for p in (HERE / "cython_ext").glob("*.pyx"))
# x86-64-v2 (every x86 server CPU since 2009) has POPCNT: without it GCC turns
# __builtin_popcountll, used for holder bitsets, into a library call.
# -ffp-contract=off (below): a worker's SGD kernel rounds as NumPy does, product then difference
ARCH_FLAGS = ["-march=x86-64-v2"] if platform.machine() in ("x86_64", "AMD64") else []


class ParallelBuildExt(build_ext):
    """``build_ext`` compiling the kernels in parallel (``--parallel``), one per core, unless told otherwise.

    With ``HYBRID_KERNELS_CACHED=1`` (launch/setup.sh sets it when it copied the kernels of these exact
    sources from its cache into the tree) a kernel whose module in the tree is not older than its C source
    is taken as built: an editable install builds in a temporary directory, so it would compile every
    kernel again (66 s on 2 cores). Not older, as make decides: launch/setup.sh touches the sources, then
    the modules, and the kernel's clock (1-4 ms ticks) can give both the same time (a fresh clone's
    set-up then compiled every kernel: 112 s instead of 14).
    """

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None and CORES > 1:
            self.parallel = CORES

    def build_extension(self, ext):
        built = HERE / self.get_ext_filename(ext.name)
        target = Path(self.get_ext_fullpath(ext.name))
        sources = [HERE / s for s in ext.sources]
        if (os.environ.get("HYBRID_KERNELS_CACHED") == "1" and built.is_file()
                and all(built.stat().st_mtime_ns >= s.stat().st_mtime_ns for s in sources)):
            if target.resolve() != built.resolve():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, target)
            return
        super().build_extension(ext)

    def copy_file(self, infile, outfile, *args, **kwargs):
        """Put a built module into the tree (``copy_extensions_to_source``) by a rename, never a rewrite in
        place: a process that has the old one loaded (a test run, a training) would crash on its truncated
        pages (SIGSEGV, seen when a set-up ran beside the unit tests)."""
        if not str(outfile).endswith(tuple(EXTENSION_SUFFIXES)):
            return super().copy_file(infile, outfile, *args, **kwargs)
        partial = f"{outfile}.{os.getpid()}.partial"
        shutil.copy2(infile, partial)
        os.replace(partial, outfile)
        return outfile, 1


extensions = [
    Extension(
        f"hybrid._ext.{name}",
        [f"cython_ext/{name}.pyx"],
        include_dirs=[np.get_include(), "cython_ext"],
        extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off", *ARCH_FLAGS],
        extra_link_args=["-fopenmp"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for name in KERNELS
]

setup(
    name="hybrid",
    version="0.1.0",
    description="Hybrid-parallel recommendation-model training with the Herald embedding scheduler",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    python_requires=">=3.10",
    packages=find_packages(include=["hybrid", "hybrid.*"]),
    ext_modules=cythonize(
        extensions,
        include_path=["cython_ext"],
        compiler_directives={"language_level": 3},
        nthreads=CORES if CORES > 1 else 0,
    ),
    cmdclass={"build_ext": ParallelBuildExt},
    package_data={"hybrid": ["py.typed"]},
    install_requires=[
        "numpy>=1.26",
        "mpi4py>=3.1",
        "pyyaml>=6.0",
        "omegaconf>=2.3",
        "tqdm>=4.66",
        "scikit-learn>=1.3",
        "scipy>=1.10",
        "pyarrow>=14",
        "pandas>=2.0",
    ],
    entry_points={"console_scripts": ["hybrid=hybrid.cli:process_main"]},
)
