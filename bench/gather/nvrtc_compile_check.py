"""Compiles fastread's gather kernel (fastread_device.cuh with the proxy's
ring fetch, as gather_kernel.c does at run time) with NVRTC on a machine
without a GPU: NVRTC is a compiler library and needs no driver. Catches
compile errors in the device header before a GPU run.

    python3 bench/gather/nvrtc_compile_check.py [--arch 90] [--ptxas]

--ptxas: compile to the architecture's machine code and print ptxas's
registers and spills per kernel (the gather kernel is held to 128
registers by its launch bounds; spills there cost the hot path).

NVRTC from FASTREAD_NVRTC or an installed ``nvidia-cuda-nvrtc`` wheel.
Exits 77 where neither is found."""
import argparse
import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "..", "..", "csrc", "gather", "device", "fastread_device.cuh")


def find_nvrtc():
    """FASTREAD_NVRTC, else the libnvrtc.so of the wheel fastread's own
    search finds (_gather_defaults.nvrtc_wheel_dir), else None."""
    if os.environ.get("FASTREAD_NVRTC"):
        return os.environ["FASTREAD_NVRTC"]
    from fastread._gather_defaults import nvrtc_wheel_dir
    lib = nvrtc_wheel_dir()
    for n in sorted(os.listdir(lib)) if lib else []:
        if n.startswith("libnvrtc.so"):
            return os.path.join(lib, n)
    return None


def compile_source(nvrtc, src, opts):
    prog = ctypes.c_void_p()
    rc = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"fr_gather.cu", 0, None, None)
    if rc:
        raise RuntimeError(f"nvrtcCreateProgram: {rc}")
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="90")
    p.add_argument("--ptxas", action="store_true", help="print registers and spills per kernel")
    a = p.parse_args()
    path = find_nvrtc()
    if not path:
        print("nvrtc_compile_check: skipped: no NVRTC (FASTREAD_NVRTC or the nvidia-cuda-nvrtc wheel)")
        return 77
    lib = os.path.dirname(path)
    for n in sorted(os.listdir(lib)):  # builtins by soname, outside the loader's path
        if n.startswith("libnvrtc-builtins.so"):
            ctypes.CDLL(os.path.join(lib, n), mode=ctypes.RTLD_GLOBAL)
    nvrtc = ctypes.CDLL(path)
    with open(HEADER) as f:
        hdr = f.read()
    opts = [f"--gpu-architecture=sm_{a.arch}", "--std=c++17", "-default-device", "-diag-suppress=177"]
    if a.ptxas:
        opts.append("--ptxas-options=-v")
    failed = 0
    for name, src in (
        ("fastread's gather kernel (proxy)",
         "#define FR_DEFINE_GATHER_KERNEL 1\n#define FR_FETCH_PROXY 1\n" + hdr),
        ("a user's kernel (fr_dev_read_row, fr_dev_gather_warp)",
         hdr + """
extern "C" __global__ void user_rows(const fr_dev_store *s, const long long *ids, int n,
                                     unsigned char *out) {
    fr_dev_counts c = {};
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) fr_dev_read_row(s, ids[i], out + (unsigned long long)i * s->row_bytes, &c);
    fr_dev_gather_warp(s, i < n ? ids[i] : 0, i < n, i, out, &c);
}
""")):
        rc, log = compile_source(nvrtc, src, opts)
        warn = log.strip()
        print(f"{'ok' if rc == 0 else 'FAILED'}: {name}" + (f"\n{warn}" if warn else ""))
        failed |= rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
