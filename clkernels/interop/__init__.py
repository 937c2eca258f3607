"""Memory shared between CUDA (PyTorch) and OpenCL on one GPU.

- :mod:`.cuda_driver`: exportable CUDA device memory (ctypes on the CUDA driver);
- :mod:`.opencl_external`: its import as an OpenCL buffer (``cl_khr_external_memory``), the
  device UUID, acquire/release;
- :mod:`.pool`: the shared pool of such blocks, and their views as CUDA arrays;
- :mod:`.torch_cuda`: the bridge that runs an op on CUDA tensors (used by the torch wrappers of
  :mod:`clkernels.torch_autograd`).

Nothing here is imported unless CUDA tensors reach an op.
"""
