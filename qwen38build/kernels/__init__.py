"""CUDA kernels: the locked toolchain, nvcc per arch, the pthfa wheel."""
