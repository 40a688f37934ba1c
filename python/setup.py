"""Builds the sparge PyTorch extension (`sparge._C`) from the library sources.

One command, from the repository root (the GPU machine has everything it needs; no network):

    python3 python/setup.py build_ext --inplace       # then: PYTHONPATH=python python3 ...
    pip install --no-build-isolation -v ./python       # or install it into the environment

The extension compiles the library itself (src/core, src/validate, src/cpu, src/dispatch.cpp and, with
CUDA, every src/cuda/**/*.cu and *.cpp except src/cuda/stub.cpp) together with the bindings in
python/csrc/, so there is no separate CMake step. Environment variables:

  SPARGE_CUDA         auto (default): CUDA backend when torch has CUDA and nvcc is found, otherwise a
                      CPU-only build (with a warning); on: fail unless the CUDA backend can be built;
                      off: CPU-only build (src/cuda/stub.cpp answers every CUDA call with an error).
  SPARGE_TORCH_ARCHS  CUDA architectures, ';'-separated (default "90a"; e.g. "90a;80").
  SPARGE_NCCL         auto (default): with CUDA, build context parallelism (src/dist, sparge.dist) when
                      nccl.h and libnccl.so.2 are found (torch's nvidia-nccl wheel first, then the CUDA
                      toolkit, then /usr), else without it (a warning; sparge.dist then raises);
                      on: fail without NCCL; off: never.
  MAX_JOBS            parallel compile jobs (ninja; default: all cores).
"""

import glob
import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# build_ext --inplace places the module relative to the working directory; work from python/ so
# the command can be run from anywhere.
os.chdir(HERE)

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - a build without torch cannot do anything useful
    sys.exit("sparge: building the extension needs PyTorch (import torch failed). Install torch first; "
             "with pip use --no-build-isolation so the installed torch is used.")


def _sources(*patterns):
    out = []
    for pattern in patterns:
        out += glob.glob(os.path.join(ROOT, pattern), recursive=True)
    return sorted(out)


def _cuda_mode():
    mode = os.environ.get("SPARGE_CUDA", "auto").strip().lower()
    if mode not in ("auto", "on", "off", "1", "0", "true", "false"):
        sys.exit(f"sparge: SPARGE_CUDA = {mode!r} (expected auto, on or off)")
    if mode in ("off", "0", "false"):
        return False
    reasons = []
    if torch.version.cuda is None:
        reasons.append(f"this torch ({torch.__version__}) is built without CUDA")
    if cpp_extension.CUDA_HOME is None:
        reasons.append("no CUDA toolkit (nvcc) found: set CUDA_HOME or put nvcc on PATH")
    if not reasons:
        return True
    msg = "sparge: cannot build the CUDA backend: " + "; ".join(reasons)
    if mode in ("on", "1", "true"):
        sys.exit(msg + " (SPARGE_CUDA=on)")
    print(msg + ". Building the CPU-only extension (CUDA tensors will raise).", file=sys.stderr)
    return False


WITH_CUDA = _cuda_mode()


def _nccl():
    """(include dir, lib dir) of an NCCL whose libnccl.so.2 is the one torch loads, or None.

    The extension links libnccl.so.2 by soname, so at run time it binds to the copy torch already
    loaded (torch is imported first). Headers and library are taken from the same place."""
    mode = os.environ.get("SPARGE_NCCL", "auto").strip().lower()
    if mode in ("off", "0", "false") or not WITH_CUDA:
        return None
    roots = []
    try:
        import nvidia.nccl as wheel  # torch's own NCCL (pip torch wheels)
        roots += [os.path.join(p) for p in wheel.__path__]
    except ImportError:
        pass
    if cpp_extension.CUDA_HOME:
        roots.append(cpp_extension.CUDA_HOME)
    roots.append("/usr")
    for root in roots:
        inc = os.path.join(root, "include")
        for lib in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            libdir = os.path.join(root, lib)
            if os.path.isfile(os.path.join(inc, "nccl.h")) and os.path.exists(os.path.join(libdir, "libnccl.so.2")):
                return inc, libdir
    msg = "sparge: NCCL (nccl.h + libnccl.so.2) not found; building without context parallelism (sparge.dist)"
    if mode in ("on", "1", "true"):
        sys.exit(msg + " (SPARGE_NCCL=on)")
    print(msg, file=sys.stderr)
    return None


NCCL = _nccl()

lib_sources = _sources("src/core/*.cpp", "src/validate/*.cpp", "src/cpu/*.cpp", "src/dispatch.cpp",
                       "src/dist/plan.cpp", "src/dist/entry.cpp")
lib_sources += _sources("src/dist/ring.cpp", "src/dist/kernels.cu") if NCCL else _sources("src/dist/stub.cpp")
binding_sources = _sources("python/csrc/*.cpp")
include_dirs = [os.path.join(ROOT, "include"), os.path.join(ROOT, "src"), os.path.join(HERE, "csrc")]
# -fno-lto: some Pythons' sysconfig CFLAGS (prepended by setuptools) carry -flto, which would
# make the g++ objects LTO IR while nvcc's host objects are not.
cxx_flags = ["-O3", "-g0", "-std=c++20", "-fvisibility=hidden", "-fno-lto"]


def _host_compiler():
    """The C++ compiler torch's ninja build uses for the .cpp sources ($CXX, else c++), as a path.

    nvcc must compile the host code of the .cu sources with this same compiler: by default it
    takes whatever g++ comes first on PATH, and an image with a second GCC (e.g. /opt/gcc) then
    links objects of two compilers (and two libstdc++ header versions) into one extension."""
    import shutil
    import subprocess
    cxx = cpp_extension.get_cxx_compiler()
    path = shutil.which(cxx) or cxx
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        version = "?"
    return path, version

if WITH_CUDA:
    cuda_sources = [s for s in _sources("src/cuda/**/*.cu", "src/cuda/**/*.cpp")
                    if os.path.basename(s) != "stub.cpp"]
    archs = [a.strip() for a in os.environ.get("SPARGE_TORCH_ARCHS", "90a").split(";") if a.strip()]
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    nvcc_flags = [
        "-O3", "-std=c++20", "-lineinfo", "--expt-relaxed-constexpr", *gencode,
        # torch.utils.cpp_extension adds -D__CUDA_NO_HALF_OPERATORS__ and friends for its own
        # kernels; the library's kernels are written (and built by CMake) with the normal cuda_fp16 /
        # cuda_bf16 operators, so undo them.
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
        "-DSPARGE_WITH_CUDA=1",
        # The host side of the .cu objects is built like the .cpp objects: same visibility (nothing
        # of the library leaks out of, or is interposed into, the extension) and NDEBUG.
        "-DNDEBUG", "-Xcompiler=-fvisibility=hidden",
    ]
    host_cxx, host_version = _host_compiler()
    if os.environ.get("CC") is None:  # with $CC set, torch passes -ccbin $CC itself
        nvcc_flags += ["-ccbin", host_cxx]
    print(f"sparge: C++ compiler {host_cxx} ({host_version}); nvcc host compiler "
          f"{os.environ.get('CC') or host_cxx}", file=sys.stderr)
    define_macros = [("SPARGE_WITH_CUDA", "1")]
    libraries, library_dirs = [], []
    if NCCL:
        include_dirs.append(NCCL[0])
        define_macros.append(("SPARGE_WITH_NCCL", "1"))
        nvcc_flags.append("-DSPARGE_WITH_NCCL=1")
        # By soname (the nvidia-nccl wheel ships only libnccl.so.2): binds to torch's loaded copy.
        libraries.append(":libnccl.so.2")
        library_dirs.append(NCCL[1])
    if len(archs) > 1:
        nvcc_flags.append(f"--threads={len(archs)}")
    ext = cpp_extension.CUDAExtension(
        name="sparge._C",
        sources=lib_sources + cuda_sources + binding_sources,
        include_dirs=include_dirs,
        define_macros=define_macros,
        libraries=libraries,
        library_dirs=library_dirs,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
    )
else:
    ext = cpp_extension.CppExtension(
        name="sparge._C",
        sources=lib_sources + [os.path.join(ROOT, "src/cuda/stub.cpp")] + binding_sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
    )

class _BuildExt(cpp_extension.BuildExtension):
    """torch's BuildExtension without -Wl,-Bsymbolic-functions on the link line.

    Debian/Ubuntu Pythons put it into LDSHARED. It binds every call inside the extension to a
    definition inside it: with a compiler that links pieces of libstdc++ into the .so (the H200
    image's /opt/gcc wrapper), `std::ostream <<` then ran a private copy whose locale the process
    never initialised, and the first error message with a number crashed (SIGSEGV, 2026-11-30).
    Without it, libstdc++'s symbols resolve to the process's one libstdc++ as usual."""

    def build_extensions(self):
        for attr in ("linker_so", "linker_so_cxx"):
            cmd = getattr(self.compiler, attr, None)
            if isinstance(cmd, list):
                setattr(self.compiler, attr, [a for a in cmd if a != "-Wl,-Bsymbolic-functions"])
        super().build_extensions()


print(f"sparge: building the {'CUDA' if WITH_CUDA else 'CPU-only'} extension "
      f"({'with NCCL ' + NCCL[1] if NCCL else 'without NCCL'}) from {len(ext.sources)} sources", file=sys.stderr)

setup(
    name="sparge",
    version="0.1.0",
    description="SpargeAttn-style block-sparse and token-level sparse attention (PyTorch extension)",
    packages=["sparge"],
    package_dir={"sparge": "sparge"},
    ext_modules=[ext],
    cmdclass={"build_ext": _BuildExt.with_options(use_ninja=True)},
    python_requires=">=3.10",
    zip_safe=False,
)
