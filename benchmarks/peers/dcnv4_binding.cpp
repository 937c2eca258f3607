// Python binding for the official DCNv4 operator's dcnv4 entry points only, so that
// benchmarks/cuda_peers.py builds dcnv4_cuda.cu alone (not flash_deform_attn_cuda.cu, which the
// official vision.cpp binds too and which costs minutes of nvcc). The declarations come from the
// official header, staged with the .cu into .peers/cuda/DCNv4/src/cuda/ (nothing re-typed):
//   dcnv4_forward(value, p_offset, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
//                 dilation_h, dilation_w, group, group_channels, offset_scale, im2col_step,
//                 remove_center, d_stride, block_thread, softmax) -> output
//   dcnv4_backward(value, p_offset, ..., offset_scale, im2col_step, grad_output, remove_center,
//                  d_stride, block_thread, softmax) -> [grad_input, grad_offset]
// The names are those of the official extension module (DCNv4.ext), so the official
// functions/dcnv4_func.py runs unchanged against this module.
#include "cuda/dcnv4_cuda.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dcnv4_forward", &dcnv4_cuda_forward, "official DCNv4 forward (CUDA)");
  m.def("dcnv4_backward", &dcnv4_cuda_backward, "official DCNv4 backward (CUDA)");
}
